// Package apperr carries the one error envelope, *api.Error, through
// Temporal: an activity or a workflow that refuses something raises it as
// an ApplicationError whose type is the error's kind and whose one detail
// is the *api.Error itself, and whoever reads a workflow's or an update's
// failure (the gateway, the CLIs' in-process callers, tests) gets the same
// *api.Error back with From, however deep Temporal wrapped it (an activity
// failure inside a child workflow failure inside an update failure).
package apperr

import (
	"context"
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// New is a refusal that retrying will not change.
func New(e *api.Error) error {
	return temporal.NewNonRetryableApplicationError(e.Message, e.Kind, nil, *e)
}

// Newf builds and raises an *api.Error in one step.
func Newf(kind string, details map[string]any, format string, a ...any) error {
	return New(api.Errorf(kind, details, format, a...))
}

// Retryable is a failure that may pass: Temporal retries the activity
// under its retry policy, and the last attempt's error reaches the caller.
func Retryable(e *api.Error) error {
	return temporal.NewApplicationError(e.Message, e.Kind, *e)
}

// Legacy ApplicationError types recorded in histories before every
// refusal carried an *api.Error, and the kinds they mean.
var legacyKinds = map[string]string{
	"InvalidArgument":   api.KindInvalidRequest,
	"ImageNotFound":     api.KindInvalidRequest,
	"NotReady":          api.KindInvalidRequest,
	"NotFound":          api.KindNotFound,
	"Conflict":          api.KindConflict,
	"OperationConflict": api.KindOperationConflict,
}

// From finds the *api.Error in a Temporal failure chain. ok is false when
// the chain holds no application error at all (a timeout, a cancellation,
// a server failure): the caller decides what to tell its client then.
func From(err error) (e *api.Error, ok bool) {
	if err == nil {
		return nil, false
	}
	var direct *api.Error
	if errors.As(err, &direct) {
		return direct, true
	}
	var first *temporal.ApplicationError
	for cur := err; cur != nil; cur = errors.Unwrap(cur) {
		app, isApp := cur.(*temporal.ApplicationError)
		if !isApp {
			continue
		}
		if first == nil {
			first = app
		}
		if app.HasDetails() {
			if d, ok := details(app); ok {
				return d, true
			}
		}
	}
	if first == nil {
		return nil, false
	}
	kind, known := legacyKinds[first.Type()]
	if !known {
		kind = first.Type()
		if !api.IsKind(kind) {
			kind = api.KindOperationFailed
		}
	}
	return &api.Error{Kind: kind, Message: first.Message(), Details: map[string]any{}}, true
}

// Client is the *api.Error a client is told for err: the refusal itself
// when there is one, else a plain statement of what happened, without
// Temporal's own wording.
func Client(err error) *api.Error {
	if e, ok := From(err); ok {
		return e
	}
	var timeout *temporal.TimeoutError
	var canceled *temporal.CanceledError
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout):
		return api.Errorf(api.KindOperationFailed, nil, "the operation did not finish in time; it may still complete (retry with the same request id to join it)")
	case errors.Is(err, context.Canceled) || errors.As(err, &canceled):
		return api.Errorf(api.KindOperationFailed, nil, "the operation was canceled")
	}
	return api.Errorf(api.KindInternal, nil, "%v", err)
}

// details decodes an application error's first detail as an *api.Error.
// The detail is an api.Error value (New); a detail of any other shape — an
// error raised by something else — is not one, and never a panic.
func details(app *temporal.ApplicationError) (e *api.Error, ok bool) {
	defer func() {
		if recover() != nil {
			e, ok = nil, false
		}
	}()
	var d api.Error
	if app.Details(&d) != nil || d.Kind == "" {
		return nil, false
	}
	if d.Details == nil {
		d.Details = map[string]any{}
	}
	return &d, true
}
