package webhookverify

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type vectorCase struct {
	Name       string            `json:"name"`
	Headers    map[string]string `json:"headers"`
	BodyBase64 string            `json:"body_base64"`
	Key        string            `json:"key"`
	NowMs      int64             `json:"now_ms"`
	Expect     string            `json:"expect"`
}

type published struct {
	PublicKeyPEM string `json:"public_key_pem"`
	HeaderName   string `json:"header_name"`
	HeaderValue  string `json:"header_value"`
	RawBody      string `json:"raw_body"`
	TimestampMs  int64  `json:"timestamp_ms"`
}

func load(t *testing.T, name string, into interface{}) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "vectors", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatal(err)
	}
}

func toHeader(fields map[string]string) http.Header {
	header := http.Header{}
	for k, v := range fields {
		header[k] = append(header[k], v) // as written, not canonicalized
	}
	return header
}

func outcome(t *testing.T, header http.Header, body []byte, key string, now time.Time) string {
	t.Helper()
	result, err := Verify(header, body, key, now)
	for _, reason := range []error{ErrNoSignatureHeader, ErrStaleTimestamp, ErrNoSignatureMatch, ErrMalformedHeader} {
		if errors.Is(err, reason) {
			return "refused: " + err.Error()
		}
	}
	if err != nil {
		t.Fatalf("not a refusal: %v", err)
	}
	return "genuine: " + result.Scheme + " signature"
}

func TestVectors(t *testing.T) {
	var file struct{ Cases []vectorCase }
	load(t, "cases.json", &file)
	if len(file.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range file.Cases {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			body, err := base64.StdEncoding.DecodeString(c.BodyBase64)
			if err != nil {
				t.Fatal(err)
			}
			if got := outcome(t, toHeader(c.Headers), body, c.Key, time.UnixMilli(c.NowMs)); got != c.Expect {
				t.Errorf("got %q, want %q", got, c.Expect)
			}
		})
	}
}

func TestPublishedExample(t *testing.T) {
	var p published
	load(t, "platform-signature.json", &p)
	header := http.Header{}
	header.Set(p.HeaderName, p.HeaderValue) // canonicalized, as net/http does
	at := time.UnixMilli(p.TimestampMs)
	result, err := Verify(header, []byte(p.RawBody), p.PublicKeyPEM, at)
	if err != nil || result.Scheme != "platform" || !result.Timestamp.Equal(at) {
		t.Fatalf("published example: %+v, %v", result, err)
	}
	if _, err := Verify(header, []byte(p.RawBody+" "), p.PublicKeyPEM, at); !errors.Is(err, ErrNoSignatureMatch) {
		t.Fatalf("changed body: %v", err)
	}

	// A single-hash check over the undigested string must fail; the two-pass one passes.
	block, _ := pem.Decode([]byte(p.PublicKeyPEM))
	parsed, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key := parsed.(*rsa.PublicKey)
	sig, _ := base64.StdEncoding.DecodeString(strings.SplitN(p.HeaderValue, ",v0=", 2)[1])
	signed := []byte(strings.SplitN(p.HeaderValue, ",", 2)[0][len("t="):] + "." + p.RawBody)
	once := sha256.Sum256(signed)
	if rsa.VerifyPKCS1v15(key, crypto.SHA256, once[:], sig) == nil {
		t.Fatal("single-hash check verified")
	}
	twice := sha256.Sum256(once[:])
	if err := rsa.VerifyPKCS1v15(key, crypto.SHA256, twice[:], sig); err != nil {
		t.Fatalf("two-pass check: %v", err)
	}
}

func TestUnusableKeys(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	smallDER, _ := x509.MarshalPKIXPublicKey(&small.PublicKey)
	for _, key := range []string{
		"", "hello", "whpk_AAAA", "whpk_!!",
		"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: smallDER})),
	} {
		if _, err := ParsePublicKey(key); err == nil {
			t.Errorf("accepted %q", key)
		}
		if _, err := Verify(http.Header{}, nil, key, time.Now()); err == nil || errors.Is(err, ErrNoSignatureHeader) {
			t.Errorf("%q: want a key error, got %v", key, err)
		}
	}
}

func TestPKCS1PublicKeyPEM(t *testing.T) {
	var p published
	load(t, "platform-signature.json", &p)
	block, _ := pem.Decode([]byte(p.PublicKeyPEM))
	parsed, _ := x509.ParsePKIXPublicKey(block.Bytes)
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(parsed.(*rsa.PublicKey))})
	header := http.Header{p.HeaderName: {p.HeaderValue}}
	if _, err := Verify(header, []byte(p.RawBody), string(pkcs1), time.UnixMilli(p.TimestampMs)); err != nil {
		t.Fatal(err)
	}
}

// The README's handler, as a receiver writes it: read the raw body, verify, then parse.
func handler(key *PublicKey, handled map[string]int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		result, err := key.Verify(r.Header, body, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		handled[result.ID]++
		w.WriteHeader(http.StatusNoContent)
	}
}

func TestHTTPHandler(t *testing.T) {
	var keys struct {
		StandardNew struct {
			Private string `json:"private_pkcs8_pem"`
			Public  string `json:"public"`
		} `json:"standard-new"`
	}
	load(t, "test-only-keys.json", &keys)
	block, _ := pem.Decode([]byte(keys.StandardNew.Private))
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ParsePublicKey(keys.StandardNew.Public)
	if err != nil {
		t.Fatal(err)
	}
	handled := map[string]int{}
	server := httptest.NewServer(handler(key, handled))
	defer server.Close()

	body := []byte(`{"type":"example","n":1}`)
	ts := fmt.Sprint(time.Now().Unix())
	sig := ed25519.Sign(parsed.(ed25519.PrivateKey), append([]byte("evt_go."+ts+"."), body...))
	post := func(body []byte) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, server.URL, bytes.NewReader(body))
		req.Header.Set("webhook-id", "evt_go")
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", "v1a,"+base64.StdEncoding.EncodeToString(sig))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		text, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(text)
	}
	if code, text := post(body); code != http.StatusNoContent {
		t.Fatalf("genuine delivery: %d %s", code, text)
	}
	if code, text := post([]byte(`{"type":"example","n":2}`)); code != http.StatusBadRequest || text != "no signature matches\n" {
		t.Fatalf("tampered delivery: %d %q", code, text)
	}
	if handled["evt_go"] != 1 {
		t.Fatalf("handled: %v", handled)
	}
}
