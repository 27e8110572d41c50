// Command register-namespace waits for a Temporal frontend and registers a
// namespace on it unless it exists (a fresh SQL-backed cluster has none).
//
//	register-namespace -address 10.0.0.1:7233 -namespace default -retention 72h
//
// With TEMPORAL_TLS_CA, TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY it connects
// with mTLS, as the product's processes do.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/durationpb"
)

func main() {
	addr := flag.String("address", "127.0.0.1:7233", "Temporal frontend host:port")
	ns := flag.String("namespace", "default", "namespace to register")
	retention := flag.Duration("retention", 72*time.Hour, "workflow retention")
	wait := flag.Duration("wait", 2*time.Minute, "how long to wait for the frontend")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		last = register(ctx, *addr, *ns, *retention)
		if last == nil {
			fmt.Printf("namespace %s ready on %s\n", *ns, *addr)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "register-namespace: %v\n", last)
	os.Exit(1)
}

func register(ctx context.Context, addr, ns string, retention time.Duration) error {
	opts := client.Options{HostPort: addr}
	tlsCfg, err := tlsFromEnv()
	if err != nil {
		return err
	}
	opts.ConnectionOptions.TLS = tlsCfg
	nc, err := client.NewNamespaceClient(opts)
	if err != nil {
		return err
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = nc.Register(rctx, &workflowservice.RegisterNamespaceRequest{Namespace: ns, WorkflowExecutionRetentionPeriod: durationpb.New(retention)})
	var exists *serviceerror.NamespaceAlreadyExists
	if err != nil && !errors.As(err, &exists) {
		return err
	}
	// A new namespace takes a moment to reach every service's cache.
	_, err = nc.Describe(rctx, ns)
	return err
}

func tlsFromEnv() (*tls.Config, error) {
	ca, cert, key := os.Getenv("TEMPORAL_TLS_CA"), os.Getenv("TEMPORAL_TLS_CERT"), os.Getenv("TEMPORAL_TLS_KEY")
	if ca == "" && cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s holds no certificate", ca)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
