// Package webhookverify verifies a webhook delivery's signature. Standard library only.
//
//	scheme "platform": X-Webhook-Signature: t=<ms>,v0=<base64>   (RSA key, PEM)
//	scheme "standard": webhook-id / webhook-timestamp / webhook-signature: v1a,<base64>
//	                   (Standard Webhooks, Ed25519 key shown as whpk_<base64>)
//
// The key you hold decides which headers are checked. Pass the RAW body bytes exactly
// as received (io.ReadAll(r.Body)): never decode and re-encode the JSON.
package webhookverify

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

const (
	PlatformWindow = 10 * time.Minute
	StandardWindow = 5 * time.Minute
)

// Reasons a delivery is refused; compare with errors.Is.
var (
	ErrNoSignatureHeader = errors.New("no signature header")
	ErrStaleTimestamp    = errors.New("stale timestamp")
	ErrNoSignatureMatch  = errors.New("no signature matches")
	ErrMalformedHeader   = errors.New("malformed header")
)

var (
	digits    = regexp.MustCompile(`^[0-9]{1,15}$`)
	base64Any = regexp.MustCompile(`^[A-Za-z0-9+/]*={0,2}$`)
)

// Result tells which scheme verified, the event id (your idempotency key) and the signed time.
type Result struct {
	Scheme    string // "platform" or "standard"
	ID        string
	Timestamp time.Time
}

// PublicKey is the key you hold, parsed; load it once with ParsePublicKey.
type PublicKey struct {
	Scheme   string
	rsaKey   *rsa.PublicKey
	ed25519K ed25519.PublicKey
}

// ParsePublicKey reads "whpk_<base64>" (standard) or a PEM public key (platform).
func ParsePublicKey(text string) (*PublicKey, error) {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, "whpk_") {
		raw, ok := decodeBase64(text[len("whpk_"):])
		if !ok || len(raw) != ed25519.PublicKeySize {
			return nil, errors.New("whpk_ key must be base64 of 32 bytes")
		}
		return &PublicKey{Scheme: "standard", ed25519K: ed25519.PublicKey(raw)}, nil
	}
	block, _ := pem.Decode([]byte(text))
	if block == nil || !strings.HasPrefix(text, "-----BEGIN") {
		return nil, errors.New("key is neither a PEM public key nor whpk_<base64>")
	}
	var parsed interface{}
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		parsed, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		parsed, err = x509.ParsePKCS1PublicKey(block.Bytes)
	default:
		err = errors.New("not a public key")
	}
	key, isRSA := parsed.(*rsa.PublicKey)
	if err != nil || !isRSA || key.N.BitLen() < 2048 {
		return nil, errors.New("PEM key is not an RSA public key of at least 2048 bits")
	}
	return &PublicKey{Scheme: "platform", rsaKey: key}, nil
}

// Verify checks one delivery against the key you hold at time now (use time.Now()).
// A refusal wraps one of the Err* reasons; an unusable key is another error.
func Verify(header http.Header, body []byte, publicKey string, now time.Time) (Result, error) {
	key, err := ParsePublicKey(publicKey)
	if err != nil {
		return Result{}, err
	}
	return key.Verify(header, body, now)
}

// Verify checks one delivery with an already parsed key.
func (k *PublicKey) Verify(header http.Header, body []byte, now time.Time) (Result, error) {
	if k.Scheme == "standard" {
		return k.verifyStandard(header, body, now)
	}
	return k.verifyPlatform(header, body, now)
}

func (k *PublicKey) verifyPlatform(header http.Header, body []byte, now time.Time) (Result, error) {
	value, err := get(header, "X-Webhook-Signature")
	if err != nil {
		return Result{}, err
	}
	t := ""
	var signatures [][]byte
	for _, entry := range strings.Split(value, ",") {
		entry = trim(entry)
		if entry == "" {
			continue
		}
		name, text, found := strings.Cut(entry, "=")
		name, text = trim(name), trim(text)
		switch {
		case !found:
			return Result{}, ErrMalformedHeader
		case name == "t":
			if t != "" || !digits.MatchString(text) {
				return Result{}, ErrMalformedHeader
			}
			t = text // the digest covers t exactly as written
		case name == "v0":
			signature, ok := decodeBase64(text)
			if !ok {
				return Result{}, ErrMalformedHeader
			}
			signatures = append(signatures, signature)
		} // other entries: future schemes, ignored
	}
	if t == "" || len(signatures) == 0 {
		return Result{}, ErrMalformedHeader
	}
	// Two passes of hashing: SHA-256 of "<t>.<body>", then RSA PKCS#1 v1.5 SHA-256 over it,
	// which hashes that digest once more.
	digest := sha256.Sum256(append([]byte(t+"."), body...))
	again := sha256.Sum256(digest[:])
	matched := false
	for _, signature := range signatures { // EVERY v0 is tried: any one may be yours
		if rsa.VerifyPKCS1v15(k.rsaKey, crypto.SHA256, again[:], signature) == nil {
			matched = true
			break
		}
	}
	if !matched {
		return Result{}, ErrNoSignatureMatch
	}
	ms, _ := strconv.ParseInt(t, 10, 64)
	if abs(now.UnixMilli()-ms) > PlatformWindow.Milliseconds() {
		return Result{}, ErrStaleTimestamp
	}
	id, err := get(header, "X-Webhook-Id") // not signed in this scheme; informational
	if errors.Is(err, ErrMalformedHeader) {
		return Result{}, err
	}
	return Result{Scheme: "platform", ID: id, Timestamp: time.UnixMilli(ms)}, nil
}

func (k *PublicKey) verifyStandard(header http.Header, body []byte, now time.Time) (Result, error) {
	value, err := get(header, "Webhook-Signature")
	if err != nil {
		return Result{}, err
	}
	id, errID := get(header, "Webhook-Id")
	ts, errTS := get(header, "Webhook-Timestamp")
	ts = trim(ts)
	entries := strings.FieldsFunc(value, func(r rune) bool { return r == ' ' || r == '\t' })
	if errID != nil || errTS != nil || id == "" || !digits.MatchString(ts) || len(entries) == 0 {
		return Result{}, ErrMalformedHeader
	}
	content := append([]byte(id+"."+ts+"."), body...)
	matched := false
	for _, entry := range entries {
		version, text, found := strings.Cut(entry, ",")
		if !found {
			return Result{}, ErrMalformedHeader
		}
		if version != "v1a" {
			continue // v1 (HMAC) and other versions: not ours
		}
		signature, ok := decodeBase64(text)
		if !ok {
			return Result{}, ErrMalformedHeader
		}
		// ed25519.Verify returns false (no panic) for a signature of the wrong length.
		matched = matched || ed25519.Verify(k.ed25519K, content, signature)
	}
	if !matched {
		return Result{}, ErrNoSignatureMatch
	}
	seconds, _ := strconv.ParseInt(ts, 10, 64)
	if abs(now.UnixMilli()-seconds*1000) > StandardWindow.Milliseconds() {
		return Result{}, ErrStaleTimestamp
	}
	return Result{Scheme: "standard", ID: id, Timestamp: time.Unix(seconds, 0)}, nil
}

// get looks a header up case-insensitively, also in maps not built by net/http.
// Absent: ErrNoSignatureHeader; given twice: ErrMalformedHeader.
func get(header http.Header, name string) (string, error) {
	var values []string
	for k, v := range header {
		if strings.EqualFold(k, name) {
			values = append(values, v...)
		}
	}
	switch len(values) {
	case 0:
		return "", ErrNoSignatureHeader
	case 1:
		return values[0], nil
	default:
		return "", ErrMalformedHeader
	}
}

// decodeBase64 is strict base64 (standard alphabet, padding optional).
func decodeBase64(text string) ([]byte, bool) {
	bare := strings.TrimRight(text, "=")
	if !base64Any.MatchString(text) || bare == "" || len(bare)%4 == 1 {
		return nil, false
	}
	decoded, err := base64.RawStdEncoding.DecodeString(bare)
	return decoded, err == nil
}

func trim(s string) string { return strings.Trim(s, " \t") }

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
