package main

import (
	"fmt"
	"os"

	"github.com/better-compute/bcd/internal/buildmode"
)

// EnvRenewalStop names a renewal step (agent.RenewStep*) at which a development
// (fakehw) build stops its first renewal for good, so a test can kill the
// process there and check that a restart finishes or redoes the renewal. Other
// builds ignore it.
const EnvRenewalStop = "BCD_TEST_RENEWAL_STOP"

// renewHook is the Renewer hook EnvRenewalStop asks for, or nil.
func renewHook() func(step string) {
	stop := os.Getenv(EnvRenewalStop)
	if !buildmode.FakeHW || stop == "" {
		return nil
	}
	return func(step string) {
		if step != stop {
			return
		}
		fmt.Fprintf(os.Stderr, "%s: renewal stopped after step %s\n", EnvRenewalStop, step)
		select {}
	}
}
