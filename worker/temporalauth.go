package worker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The embedded Temporal answers only clients that present a token derived
// from the deployment secret: every RPC of its frontend (gRPC, and its HTTP
// API, which runs the same interceptors) carries
// "authorization: Bearer <FrontendToken>". Gateways and workers of one
// deployment share the secret, so they derive the same token; nothing else
// on the machine knows it.
//
// The check is a unary interceptor chained into the frontend
// (temporal.WithChainedFrontendGrpcInterceptors, which devserver's
// StartOptions.GRPCInterceptors feed); the HTTP API runs the same chain.
// Behind the frontend, the history and matching services accept only
// internode mutual TLS (internodetls.go). Temporal's own system worker (scanner, scheduler,
// batcher) runs in this process and dials the frontend without any token;
// its calls are admitted because their connection is this process's own
// socket (the client end of the loopback connection is a file descriptor
// of this process, which no other process can forge).

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
		if !ok && !fromThisProcess(ctx) {
			return nil, status.Error(codes.Unauthenticated, "this Temporal serves only the sandbox gateway and its workers (authorization token missing or wrong)")
		}
		return handler(ctx, req)
	}
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
