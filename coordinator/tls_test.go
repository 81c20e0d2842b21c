package coordinator_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardpool/shardpool/coordinator"
)

// startTLS starts a coordinator with TLS and a token on data; the returned
// func stops it.
func startTLS(t *testing.T, data string) (*coordinator.Coordinator, func()) {
	t.Helper()
	c, r := runCoordinator(t, coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Auth: true, TLS: true})
	return c, r.stop
}

// TestTLSListenersPinTheStoresAuthority: with Config.TLS the NATS and HTTP
// listeners serve TLS with a certificate issued by the store's own
// authority. A client that pins its ca.pem gets in (with the token); one
// that trusts the system's roots, or pins another coordinator's authority,
// is refused at the handshake, before it sends the token. The authority
// is kept across restarts (the listener's certificate is issued anew),
// and its key is readable by this user alone.
func TestTLSListenersPinTheStoresAuthority(t *testing.T) {
	data := t.TempDir()
	c, stop := startTLS(t, data)
	if c.CAFile() != filepath.Join(data, "jetstream", coordinator.CAName) {
		t.Fatalf("CAFile %q, want it in the store", c.CAFile())
	}
	if fi, err := os.Stat(filepath.Join(data, "jetstream", "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the authority's key: %v (%v), want mode 0600", fi, err)
	}
	tok, err := coordinator.ReadToken(c.TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	url := c.ClientURL()
	if nc, err := nats.Connect(url, nats.Token(tok)); err == nil {
		nc.Close()
		t.Fatal("a client trusting the system's roots was taken")
	} else if !strings.Contains(err.Error(), "x509") {
		t.Fatalf("a client trusting the system's roots: %v, want a certificate error", err)
	}
	pinned, err := coordinator.ClientTLS(c.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.Token(tok), nats.Secure(pinned))
	if err != nil {
		t.Fatalf("a client pinning ca.pem: %v", err)
	}
	if _, err := nc.TLSConnectionState(); err != nil {
		t.Fatalf("the connection is not TLS: %v", err)
	}
	nc.Close()

	// Another coordinator's authority does not verify this one.
	other, _ := startTLS(t, t.TempDir())
	wrong, err := coordinator.ClientTLS(other.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(url, nats.Token(tok), nats.Secure(wrong)); err == nil {
		nc.Close()
		t.Fatal("a client pinning another coordinator's authority was taken")
	} else if !strings.Contains(err.Error(), "not issued by the authority in "+other.CAFile()) {
		t.Fatalf("another authority: %v, want it named", err)
	}

	// HTTPS: /healthz with the authority pinned; plain HTTP is refused.
	cl := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: pinned}}
	resp, err := cl.Get("https://" + c.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatalf("https /healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || c.StatusURL() != "https://"+c.HTTPAddr()+"/status" {
		t.Fatalf("https /healthz: %d; status URL %s", resp.StatusCode, c.StatusURL())
	}
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + c.HTTPAddr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served")
		}
	}

	// A restart keeps the authority: a client holding the old ca.pem
	// gets in.
	before, _ := os.ReadFile(c.CAFile())
	stop()
	c, _ = startTLS(t, data)
	after, _ := os.ReadFile(c.CAFile())
	if !bytes.Equal(before, after) {
		t.Fatal("the certificate authority changed across a restart")
	}
	nc, err = nats.Connect(c.ClientURL(), nats.Token(tok), nats.Secure(pinned))
	if err != nil {
		t.Fatalf("after a restart, with the ca.pem copied before it: %v", err)
	}
	nc.Close()
}

// TestTLSAuthorityHalfPresentIsRefused: a ca.pem without its key (or the
// key without ca.pem) is not replaced by a new authority, which would
// leave every worker holding the old ca.pem unable to connect without
// knowing why.
func TestTLSAuthorityHalfPresentIsRefused(t *testing.T) {
	data := t.TempDir()
	_, stop := startTLS(t, data)
	stop()
	if err := os.Remove(filepath.Join(data, "jetstream", "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", Auth: true, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	if err == nil {
		c.Close()
		t.Fatal("started with a certificate authority missing its key")
	}
	if !strings.Contains(err.Error(), "remove both to make a new one") {
		t.Fatalf("got %v, want the way out named", err)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:4222": true, "[::1]:4222": true, "localhost:0": true, "127.3.2.1:1": true,
		"0.0.0.0:4222": false, ":4222": false, "10.0.0.5:4222": false, "node12:4222": false, "bad": false,
	} {
		if got := coordinator.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
