package api

import (
	"errors"
	"fmt"
	"net/http"
)

// Error kinds (the seed's, plus ours at the end).
const (
	KindInvalidRequest  = "invalid_request"
	KindOperationFailed = "operation_failed"
	KindNotFound        = "not_found"
	KindInternal        = "internal_error"
	KindUnknownOp       = "unknown_op"
	KindUnauthorized    = "unauthorized"
	KindBadJSON         = "bad_json"
	KindRequestTooLarge = "request_too_large"
	KindServerBusy      = "server_busy"
	KindShuttingDown    = "server_shutting_down"
	KindConflict        = "source_conflict"
	// KindOperationConflict: another operation on the same object is in
	// progress (the seed's kind for a duplicate command id).
	KindOperationConflict = "operation_conflict"
	KindMethodNotAllowed  = "method_not_allowed"
	// KindResourceExhausted: a per-sandbox budget refused the request (too
	// many sessions or running commands, a change set larger than the
	// maximum publish size). details.limit names the budget and
	// details.max its value. HTTP 429: like server_busy it clears when the
	// caller frees something (destroys a session, lets commands end, splits
	// a publish), unlike it a retry of the same request without that fails
	// again, so clients must not retry it blindly.
	KindResourceExhausted = "resource_exhausted"
	// KindFailedPrecondition: the object is not in a state that allows the
	// operation (a paused sandbox asked to run a command, restoring a
	// session that is not archived); details say which state and which
	// operation changes it (details.hint). HTTP 409.
	KindFailedPrecondition = "failed_precondition"
)

var kinds = map[string]bool{
	KindInvalidRequest: true, KindOperationFailed: true, KindNotFound: true, KindInternal: true, KindUnknownOp: true,
	KindUnauthorized: true, KindBadJSON: true, KindRequestTooLarge: true, KindServerBusy: true, KindShuttingDown: true,
	KindConflict: true, KindOperationConflict: true, KindMethodNotAllowed: true, KindResourceExhausted: true, KindFailedPrecondition: true,
}

// IsKind reports whether k is one of the wire's error kinds.
func IsKind(k string) bool { return kinds[k] }

// Error is the body of the error envelope {"error": {...}}.
type Error struct {
	Kind    string         `json:"kind"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// Envelope wraps an Error on the wire.
type Envelope struct {
	Error *Error `json:"error"`
}

func (e *Error) Error() string { return e.Kind + ": " + e.Message }

// Errorf builds an *Error.
func Errorf(kind string, details map[string]any, format string, a ...any) *Error {
	if details == nil {
		details = map[string]any{}
	}
	return &Error{Kind: kind, Message: fmt.Sprintf(format, a...), Details: details}
}

// AsError converts any error into an *Error (internal_error when untyped).
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: KindInternal, Message: err.Error(), Details: map[string]any{}}
}

// HTTPStatus maps an error kind to its HTTP status.
func HTTPStatus(kind string) int {
	switch kind {
	case KindInvalidRequest, KindBadJSON, KindUnknownOp:
		return http.StatusBadRequest
	case KindUnauthorized:
		return http.StatusUnauthorized
	case KindNotFound:
		return http.StatusNotFound
	case KindRequestTooLarge:
		return http.StatusRequestEntityTooLarge
	case KindServerBusy, KindResourceExhausted:
		return http.StatusTooManyRequests
	case KindShuttingDown:
		return http.StatusServiceUnavailable
	case KindOperationFailed, KindConflict, KindOperationConflict, KindFailedPrecondition:
		return http.StatusConflict
	case KindMethodNotAllowed:
		return http.StatusMethodNotAllowed
	default:
		return http.StatusInternalServerError
	}
}

// Endpoint is where a sandbox's daemon listens (inspect_sandbox's daemon
// and daemon_http).
type Endpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}
