package activities

// SetDaemonArgs sets the sandbox-daemon flags of the containers created
// from now on (the gateway YAML's daemon settings, package config); a
// sandbox keeps the flags it was created with. Call it before the workers
// start.
func (a *Activities) SetDaemonArgs(args []string) { a.daemonArgs = append([]string(nil), args...) }
