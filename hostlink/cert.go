package hostlink

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

	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

// Cert is the forwarder's TLS certificate and its pin.
type Cert struct {
	TLS         tls.Certificate
	Fingerprint string // daemonclient.Fingerprint of the leaf
}

// LoadCert loads a certificate and key (PEM files, e.g. from the
// cluster's CA).
func LoadCert(certFile, keyFile string) (Cert, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return Cert{}, fmt.Errorf("forwarder certificate: %w", err)
	}
	return Cert{TLS: pair, Fingerprint: daemonclient.Fingerprint(pair.Certificate[0])}, nil
}

// LoadOrCreateCert loads dir/hostlink.pem and dir/hostlink.key, or makes a
// self-signed ECDSA P-256 certificate for hosts there first (files 0600,
// dir 0700). Its fingerprint stays the same across restarts.
func LoadOrCreateCert(dir string, hosts []string) (Cert, error) {
	certFile, keyFile := filepath.Join(dir, "hostlink.pem"), filepath.Join(dir, "hostlink.key")
	if c, err := LoadCert(certFile, keyFile); err == nil {
		return c, nil
	} else if _, serr := os.Stat(certFile); !errors.Is(serr, os.ErrNotExist) {
		return Cert{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Cert{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return Cert{}, err
	}
	tpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "eos-hostlink"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tpl.IPAddresses = append(tpl.IPAddresses, ip)
		} else if h != "" {
			tpl.DNSNames = append(tpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return Cert{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Cert{}, err
	}
	if err := writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})); err != nil {
		return Cert{}, err
	}
	if err := writeFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return Cert{}, err
	}
	return LoadCert(certFile, keyFile)
}

func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
