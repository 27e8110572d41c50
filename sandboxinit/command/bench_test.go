package command

import (
	"context"
	"os"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// BenchmarkStartTrue measures starting `true` and waiting for its terminal
// response: fork/exec of /bin/sh on the host plus the engine's own overhead
// (pipes, goroutines, id, rendering).
func BenchmarkStartTrue(b *testing.B) {
	e, h := newTestEngine(b, Options{})
	ctx := context.Background()
	args := api.ExecCommandArgs{Cmd: "true", YieldTimeMS: ms(long)}
	b.ReportAllocs()
	for b.Loop() {
		out, err := e.Start(ctx, h.start, args, Meta{})
		if err != nil || out.Status != api.StatusOK {
			b.Fatalf("%v %+v", err, out)
		}
	}
}

// exitedProc is a process that has already exited 0.
type exitedProc struct{}

func (exitedProc) Pid() int                       { return 1 }
func (exitedProc) Wait() (int, error)             { return 0, nil }
func (exitedProc) Signal(os.Signal) error         { return os.ErrProcessDone }
func (exitedProc) Resize(rows, cols uint16) error { return nil }

// BenchmarkStartNoProcess measures the engine alone: a starter that creates
// no process.
func BenchmarkStartNoProcess(b *testing.B) {
	e, _ := newTestEngine(b, Options{})
	ctx := context.Background()
	start := func(context.Context, Spec) (Process, error) { return exitedProc{}, nil }
	args := api.ExecCommandArgs{Cmd: "true", YieldTimeMS: ms(long)}
	b.ReportAllocs()
	for b.Loop() {
		out, err := e.Start(ctx, start, args, Meta{})
		if err != nil || out.Status != api.StatusOK {
			b.Fatalf("%v %+v", err, out)
		}
	}
}
