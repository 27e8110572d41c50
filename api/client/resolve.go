package client

import (
	"errors"
	"os"
)

// Resolve builds a client the way every front end finds its gateway: the
// endpoint from the flag, else SANDBOX_GATEWAY_SOCKET, else the default;
// the token from the flag, else SANDBOX_GATEWAY_AUTH_TOKEN, else the token
// file (a missing file means no token; an unsafe one is an error).
func Resolve(endpoint, token string) (*Client, error) {
	if endpoint == "" {
		endpoint = EndpointFromEnv()
	}
	if token == "" {
		token = os.Getenv("SANDBOX_GATEWAY_AUTH_TOKEN")
	}
	if token == "" {
		t, err := ReadToken(TokenPath())
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		token = t
	}
	return New(endpoint, token), nil
}
