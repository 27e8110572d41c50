package worker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The embedded Temporal answers only clients that present a token derived
// from the deployment secret: every RPC of its frontend (gRPC, and its HTTP
// API, which runs the same interceptors) carries
// "authorization: Bearer <FrontendToken>". Gateways and workers of one
// deployment share the secret, so they derive the same token; nothing else
// on the machine knows it.
//
// The check is a unary interceptor chained into the frontends
// (temporal.WithChainedFrontendGrpcInterceptors); the HTTP API runs the
// same chain. Temporal's own system worker has no token: it calls the
// internal frontend, which like history and matching accepts only internode
// mutual TLS with a certificate made in memory at this start
// (internodetls.go); a call whose connection presented that certificate is
// admitted. The public frontend is plain TCP, so there it is the token or
// nothing.

// FrontendToken is hex(HMAC-SHA256(secret, "temporal-frontend")).
func FrontendToken(secret []byte) string { return derive(secret, "temporal-frontend") }

// UIToken is the login token of the embedded Temporal UI.
func UIToken(secret []byte) string { return derive(secret, "temporal-ui") }

func derive(secret []byte, purpose string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(purpose))
	return hex.EncodeToString(m.Sum(nil))
}

// frontendAuth refuses every frontend RPC that does not carry the token.
func frontendAuth(token string) grpc.UnaryServerInterceptor {
	want := sha256.Sum256([]byte("Bearer " + token))
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ok := false
		for _, v := range md.Get("authorization") {
			got := sha256.Sum256([]byte(v))
			ok = ok || subtle.ConstantTimeCompare(got[:], want[:]) == 1
		}
		if !ok && !internodePeer(ctx) {
			return nil, status.Error(codes.Unauthenticated, "this Temporal serves only the sandbox gateway and its workers (authorization token missing or wrong)")
		}
		return handler(ctx, req)
	}
}

// internodePeer: the call came over TLS with a client certificate that
// verified against the server's client CAs (only the internal frontend
// asks for one, and only this process holds a certificate of that CA).
func internodePeer(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.PeerCertificates) > 0
}

// tokenHeaders is the SDK client's HeadersProvider presenting the token.
type tokenHeaders string

func (t tokenHeaders) GetHeaders(context.Context) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// Headers is the HeadersProvider of an SDK client of the embedded Temporal
// (client.Options.HeadersProvider): it presents FrontendToken(secret).
func Headers(secret []byte) interface {
	GetHeaders(context.Context) (map[string]string, error)
} {
	return tokenHeaders(FrontendToken(secret))
}
