#!/bin/sh
# Starts RabbitMQ in the foreground as the rabbitmq user. The default user
# (made when the node starts on empty data) is RABBITMQ_DEFAULT_USER with
# RABBITMQ_DEFAULT_PASS, allowed to connect from other hosts, as in the
# official image.
set -eu
cat >/etc/rabbitmq/rabbitmq.conf <<CONF
default_user = ${RABBITMQ_DEFAULT_USER:-guest}
default_pass = ${RABBITMQ_DEFAULT_PASS:-guest}
loopback_users = none
listeners.tcp.default = 5672
management.tcp.port = 15672
CONF
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
