package activities

// SetDaemonArgs sets the sandbox-daemon flags of the containers created
// from now on (the gateway YAML's daemon settings, package config); a
// sandbox keeps the flags it was created with. Call it before the workers
// start. (A function, not a method: every exported method of *Activities
// is an activity.)
func SetDaemonArgs(a *Activities, args []string) { a.daemonArgs = append([]string(nil), args...) }
