package workflows

import (
	"context"
	"encoding/json"

	"github.com/ephemeral-sandbox/sandbox/api"
	"go.temporal.io/sdk/temporal"
)

// stubActivities has the signatures of package activities' methods, so the
// tests mock them by their registered names without importing the
// implementation (TestActivityContract in package worker keeps the two
// equal).
type stubActivities struct{}

var acts *stubActivities

func (*stubActivities) CheckImage(context.Context, string) error { return nil }
func (*stubActivities) CreateVolume(context.Context, SandboxSpec) (string, error) {
	return "", nil
}
func (*stubActivities) PrepareSandbox(context.Context, SandboxSpec) error { return nil }
func (*stubActivities) CreateContainer(context.Context, SandboxSpec) (ContainerInfo, error) {
	return ContainerInfo{}, nil
}
func (*stubActivities) CopyWorkspace(context.Context, SandboxSpec) (CopyReport, error) {
	return CopyReport{}, nil
}
func (*stubActivities) ImportWorkspace(context.Context, ImportWorkspaceInput) (ImportWorkspaceResult, error) {
	return ImportWorkspaceResult{}, nil
}
func (*stubActivities) StartContainer(context.Context, string) (ContainerInfo, error) {
	return ContainerInfo{}, nil
}
func (*stubActivities) WaitReady(context.Context, string, api.Endpoint) error { return nil }
func (*stubActivities) RemoveSandbox(context.Context, string) error           { return nil }
func (*stubActivities) CallDaemon(context.Context, DaemonCall) (json.RawMessage, error) {
	return nil, nil
}
func (*stubActivities) CallDaemonHere(context.Context, DaemonCall) (json.RawMessage, error) {
	// Unmocked, a local call is on another host: the workflow falls back
	// to CallDaemon.
	return nil, temporal.NewNonRetryableApplicationError("another host", ErrTypeNotHere, nil)
}
func (*stubActivities) ResolveDaemon(context.Context, string) (ContainerInfo, error) {
	return ContainerInfo{}, nil
}
func (*stubActivities) ExportChanges(context.Context, ExportSpec) (*api.ExportResult, error) {
	return nil, nil
}
func (*stubActivities) StopContainer(context.Context, string) error { return nil }
func (*stubActivities) Pass(context.Context) error                  { return nil }
