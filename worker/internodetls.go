package worker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"

	"go.temporal.io/server/common/config"
)

// internodeName is the name the embedded services' certificate carries and
// their clients verify.
const internodeName = "eos-temporal-internode"

// internodeTLS is mutual TLS between the embedded server's own services
// (frontend, history, matching, worker): a CA and one certificate made in
// memory at each start and never written anywhere, so no other process can
// present a certificate those services accept. The frontend's public
// listener stays plain TCP; the token guards it.
func internodeTLS() (config.RootTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return config.RootTLS{}, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: internodeName + "-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return config.RootTLS{}, fmt.Errorf("internode CA: %w", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return config.RootTLS{}, err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: internodeName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		DNSNames: []string{internodeName}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return config.RootTLS{}, fmt.Errorf("internode certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return config.RootTLS{}, err
	}
	b64 := func(typ string, der []byte) string {
		return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	caData := b64("CERTIFICATE", caDER)
	return config.RootTLS{Internode: config.GroupTLS{
		Server: config.ServerTLS{CertData: b64("CERTIFICATE", leafDER), KeyData: b64("EC PRIVATE KEY", keyDER),
			ClientCAData: []string{caData}, RequireClientAuth: true},
		Client: config.ClientTLS{ServerName: internodeName, RootCAData: []string{caData}},
	}}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
