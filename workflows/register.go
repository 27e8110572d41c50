package workflows

import "go.temporal.io/sdk/workflow"

func workflowOpts(name string) workflow.RegisterOptions { return workflow.RegisterOptions{Name: name} }
