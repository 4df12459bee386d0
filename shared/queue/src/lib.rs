//! The queue seam: the delivery message, its codec and its constructors
//! ([`message`]), and the queues that carry it: RabbitMQ ([`amqp`]) in the
//! distributed mode, the deliveries table of the SQLite store in standalone
//! mode.

pub mod amqp;
pub mod message;

pub use message::{DecodeError, DeliveryMessage, Message, PARK_LIMIT};
