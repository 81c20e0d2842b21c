package coordinator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
)

// CAName is the file in a coordinator's store directory that holds the
// certificate of its own certificate authority (Config.TLS): clients pin
// it, so it is copied with the token to the hosts of workers. The
// authority's key (caKeyName, readable by this user alone) never leaves
// the store; the listener's certificate is issued from it at every start,
// for the host names and addresses the host has then, and kept in memory
// only.
const CAName = "ca.pem"

const caKeyName = "ca-key.pem"

// IsLoopback reports whether a listen address (host:port) takes only
// connections from this host: a loopback IP or "localhost". An empty host
// listens on every interface.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loadOrCreateCA reads the store's certificate authority, or makes one (an
// ECDSA P-256 key and a self-signed certificate for 10 years), durable
// before any client can be given it.
func loadOrCreateCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certFile, keyFile := filepath.Join(dir, CAName), filepath.Join(dir, caKeyName)
	certPEM, certErr := os.ReadFile(certFile)
	keyPEM, keyErr := os.ReadFile(keyFile)
	for i := 0; keyErr == nil && errors.Is(certErr, os.ErrNotExist) && i < caWaitTries; i++ {
		// Another coordinator of a cluster sharing dir made the key and is
		// writing the certificate (makeCA writes the key first).
		time.Sleep(caWaitPause)
		certPEM, certErr = os.ReadFile(certFile)
	}
	if certErr == nil && keyErr == nil {
		cert, err := parseCert(certPEM)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", certFile, err)
		}
		kb, _ := pem.Decode(keyPEM)
		if kb == nil {
			return nil, nil, fmt.Errorf("%s: no PEM block", keyFile)
		}
		key, err := x509.ParseECPrivateKey(kb.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
		}
		return cert, key, nil
	}
	if !errors.Is(certErr, os.ErrNotExist) || !errors.Is(keyErr, os.ErrNotExist) {
		// One without the other: clients may hold the certificate, so a new
		// authority must not silently replace it.
		return nil, nil, fmt.Errorf("certificate authority in %s: %s: %v; %s: %v (remove both to make a new one, then copy the new %s to the workers' hosts)",
			dir, CAName, certErr, caKeyName, keyErr, CAName)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "shardpool coordinator CA " + host, Organization: []string{"shardpool"}},
		NotBefore:             now.Add(-certSkew),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	// The key first: a certificate on disk without its key is refused
	// above. Of coordinators of a cluster making it at once in a shared
	// directory, the one that links its key into place makes the
	// authority; the others take it.
	created, err := checkpoint.CreateFilePerm(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	if err != nil {
		return nil, nil, err
	}
	if !created {
		return loadOrCreateCA(dir)
	}
	if err := checkpoint.WriteFilePerm(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// caWaitTries and caWaitPause bound the wait for a certificate authority
// another coordinator is making in a shared directory.
const (
	caWaitTries = 50
	caWaitPause = 100 * time.Millisecond
)

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// certSkew is how far back a new certificate's validity starts: a worker
// whose clock runs behind the coordinator's (a node whose time service
// failed, a clock kept in local time) still takes it. It was an hour, and
// a node two hours behind was refused every connection. The authority is
// pinned, so the window's start guards nothing else.
const certSkew = 48 * time.Hour

// ErrCertTime is a coordinator certificate refused for this host's time
// alone: the clock of one of the two hosts is wrong.
var ErrCertTime = errors.New("the coordinator's certificate is not valid at this host's time")

// leafCert issues the listeners' certificate from the authority, for
// localhost, the host's name, the listen host and every address of the
// host's interfaces (so that the nats CLI, which checks the name, can
// reach it by any of them); valid for a year from this start.
func leafCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, listenHosts ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "shardpool coordinator", Organization: []string{"shardpool"}},
		NotBefore:    time.Now().Add(-certSkew),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client auth too: a coordinator of a cluster presents it when it
		// dials another's route listener.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	names := append([]string{}, listenHosts...)
	if h, err := os.Hostname(); err == nil {
		names = append(names, h)
	}
	for _, n := range names {
		if n == "" {
			continue
		}
		if ip := net.ParseIP(n); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, n.IP)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}, nil
}

// serverTLS is the listeners' TLS configuration for the authority in dir,
// and routeTLS, for a cluster, that of the routes: mutual TLS, each side's
// certificate issued by the same authority.
func serverTLS(dir string, listenHosts ...string) (listeners, routes *tls.Config, err error) {
	ca, key, err := loadOrCreateCA(dir)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := leafCert(ca, key, listenHosts...)
	if err != nil {
		return nil, nil, fmt.Errorf("issue the listener's certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	routes = &tls.Config{
		Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
		// A peer is dialed by whatever name --peers gives it: the chain to
		// the cluster's own authority is checked, not the name (as
		// ClientTLS does for clients).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the other coordinator sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
			if err != nil {
				return fmt.Errorf("the other coordinator's certificate is not issued by the cluster's authority (%s): %w", filepath.Join(dir, CAName), err)
			}
			return nil
		},
	}
	return &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12}, routes, nil
}

// caDir is where the coordinator's certificate authority lives: beside
// its token file when one is given (a cluster's coordinators share both,
// and clients pin the ca.pem beside their token file), else in its store.
func (c *Coordinator) caDir() string {
	if c.cfg.TokenFile != "" {
		return filepath.Dir(c.cfg.TokenFile)
	}
	return c.cfg.StoreDir
}

// ClientTLS is a client's TLS configuration for a coordinator whose
// authority's certificate is in caFile: the coordinator's certificate
// must be issued by it. Its host name is not checked: the authority is
// this coordinator's own, so a certificate it issued is proof enough, and
// workers reach a coordinator by whatever name or address their network
// gives it. The file is read at every handshake, as the token is: a
// worker started before its coordinator (on a home directory they share)
// finds it once the coordinator has made it. A file that exists and is no
// certificate is an error now.
func ClientTLS(caFile string) (*tls.Config, error) {
	if _, err := readCA(caFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the chain is verified below, without the host name
		VerifyConnection: func(cs tls.ConnectionState) error {
			ca, err := readCA(caFile)
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the coordinator sent no certificate")
			}
			pool, inter := x509.NewCertPool(), x509.NewCertPool()
			pool.AddCert(ca)
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			opts := x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			_, err = cs.PeerCertificates[0].Verify(opts)
			var invalid x509.CertificateInvalidError
			if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
				// Issued by the pinned authority, at another time than
				// this host's: say so, not that it is another authority.
				leaf := cs.PeerCertificates[0]
				opts.CurrentTime = leaf.NotBefore.Add(time.Second)
				if _, again := leaf.Verify(opts); again == nil {
					return fmt.Errorf("%w: it is issued by the authority in %s for %s to %s, and this host's clock says %s: is one of the two hosts' clocks wrong? (timedatectl; chronyc tracking)",
						ErrCertTime, caFile, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339))
				}
			}
			if err != nil {
				return fmt.Errorf("the coordinator's certificate is not issued by the authority in %s: %w", caFile, err)
			}
			return nil
		},
	}, nil
}

func readCA(caFile string) (*x509.Certificate, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("certificate authority file: %w", err)
	}
	ca, err := parseCert(b)
	if err != nil {
		return nil, fmt.Errorf("certificate authority file %s: %w", caFile, err)
	}
	return ca, nil
}

// CAFile is the file clients pin the listener's certificate with, or ""
// when the coordinator does not serve TLS (Config.TLS unset).
func (c *Coordinator) CAFile() string {
	if !c.cfg.TLS {
		return ""
	}
	return filepath.Join(c.caDir(), CAName)
}
