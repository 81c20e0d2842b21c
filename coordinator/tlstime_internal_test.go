package coordinator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCertificateAtAnotherTimeSaysClocks: a worker whose clock runs hours
// behind the coordinator's was refused every connection, told that the
// coordinator was not the one whose authority it pinned. New certificates
// now start 48 hours back, and one of the pinned authority refused for
// this host's time alone says so, naming the clocks; one of another
// authority is still another authority's.
func TestCertificateAtAnotherTimeSaysClocks(t *testing.T) {
	dir := t.TempDir()
	ca, key, err := loadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, otherKey, err := loadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A leaf as the coordinator issues it now, seen from a host two hours
	// behind: still valid there.
	issued, err := leafCert(ca, key)
	if err != nil {
		t.Fatal(err)
	}
	now, err := x509.ParseCertificate(issued.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if skew := time.Since(now.NotBefore); skew < 47*time.Hour || ca.NotBefore.After(time.Now().Add(-47*time.Hour)) {
		t.Errorf("new certificates valid from %s back (authority %s), want 48 hours", skew, time.Since(ca.NotBefore))
	}
	// Leaves issued at a time this host's clock has not reached (its
	// clock behind the issuer's by more than the window).
	future := func(issuer *x509.Certificate, issuerKey *ecdsa.PrivateKey) *x509.Certificate {
		t.Helper()
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "shardpool coordinator"},
			NotBefore: time.Now().Add(3 * time.Hour), NotAfter: time.Now().Add(5 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &k.PublicKey, issuerKey)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg, err := ClientTLS(filepath.Join(dir, CAName))
	if err != nil {
		t.Fatal(err)
	}
	verify := func(c *x509.Certificate) error {
		return cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}})
	}
	if err := verify(now); err != nil {
		t.Errorf("the coordinator's certificate of now: %v", err)
	}
	err = verify(future(ca, key))
	if !errors.Is(err, ErrCertTime) || !strings.Contains(err.Error(), "is one of the two hosts' clocks wrong?") {
		t.Errorf("a certificate of the pinned authority from 3 hours ahead: %v; want ErrCertTime naming the clocks", err)
	}
	err = verify(future(other, otherKey))
	if errors.Is(err, ErrCertTime) || err == nil || !strings.Contains(err.Error(), "not issued by the authority in") {
		t.Errorf("a certificate of another authority from 3 hours ahead: %v; want another authority's", err)
	}
}
