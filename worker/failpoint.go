package worker

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
)

// FailpointEnv arms a worker failpoint for crash tests: "<activity>",
// "CallDaemon:<op>" or "CallDaemonHere:<op>" (the local call). The worker SIGKILLs itself right after that activity
// succeeded and before Temporal hears of it — the worst moment to crash:
// the side effect happened, the history does not know.
const FailpointEnv = "EOS_WORKER_FAILPOINT"

// FailpointInterceptor returns the interceptor for the armed failpoint, or
// nil when none is armed.
func FailpointInterceptor() interceptor.WorkerInterceptor {
	fp := os.Getenv(FailpointEnv)
	if fp == "" {
		return nil
	}
	return &failpoint{target: fp}
}

type failpoint struct {
	interceptor.WorkerInterceptorBase
	target string
}

func (f *failpoint) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	i := &failpointActivity{target: f.target}
	i.Next = next
	return i
}

type failpointActivity struct {
	interceptor.ActivityInboundInterceptorBase
	target string
}

func (f *failpointActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (interface{}, error) {
	res, err := f.Next.ExecuteActivity(ctx, in)
	if err != nil {
		return res, err
	}
	name := activity.GetInfo(ctx).ActivityType.Name
	if (name == "CallDaemon" || name == "CallDaemonHere") && len(in.Args) > 0 {
		var call struct {
			Op string `json:"op"`
		}
		if b, jerr := json.Marshal(in.Args[0]); jerr == nil && json.Unmarshal(b, &call) == nil {
			name += ":" + call.Op
		}
	}
	if strings.EqualFold(name, f.target) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return res, err
}
