package worker

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
)

// FailpointEnv arms a worker failpoint for crash tests: "<activity>",
// "CallDaemon:<op>" or "CallDaemonHere:<op>" (the local call), optionally
// followed by "#<n>": the n-th success of it in this process (default the
// first). The worker SIGKILLs itself right after that activity succeeded
// and before Temporal hears of it — the worst moment to crash: the side
// effect happened, the history does not know.
const FailpointEnv = "EOS_WORKER_FAILPOINT"

// FailpointInterceptor returns the interceptor for the armed failpoint, or
// nil when none is armed (or the value does not parse).
func FailpointInterceptor() interceptor.WorkerInterceptor {
	fp := os.Getenv(FailpointEnv)
	if fp == "" {
		return nil
	}
	target, nth := fp, int64(1)
	if i := strings.LastIndexByte(fp, '#'); i >= 0 {
		n, err := strconv.ParseInt(fp[i+1:], 10, 64)
		if err != nil || n < 1 {
			return nil
		}
		target, nth = fp[:i], n
	}
	return &failpoint{target: target, nth: nth}
}

type failpoint struct {
	interceptor.WorkerInterceptorBase
	target string
	nth    int64
	seen   atomic.Int64
}

func (f *failpoint) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	i := &failpointActivity{fp: f}
	i.Next = next
	return i
}

type failpointActivity struct {
	interceptor.ActivityInboundInterceptorBase
	fp *failpoint
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
	if strings.EqualFold(name, f.fp.target) && f.fp.seen.Add(1) == f.fp.nth {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return res, err
}
