// Package storetest is the conformance suite of the store interfaces: every
// implementation of store.Store (store/sqlite now, PostgreSQL later) runs
// Run from its own tests, so the guarantees the rest of the control plane
// relies on — a join token or boot nonce consumed once under concurrency,
// conflicts reported with their errors, a stale deployment write refused,
// the machine's timeline written with what it records — are checked once,
// through the interfaces alone, and hold for each of them.
//
// The suite knows no implementation: what is particular to one (its
// migrations, its files) is tested beside it.
package storetest

import (
	"context"
	"testing"

	"github.com/better-compute/bcd/controlplane/store"
)

// ctx is the suite's context: nothing in it is cancelled.
var ctx = context.Background()

// Run runs the suite, one subtest per behaviour. open returns a new, empty
// store for each subtest (no site, no node) and closes it when the subtest
// ends (t.Cleanup).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, store.Store)
	}{
		{"SitesAndTokens", testSitesAndTokens},
		{"AdmitConsumesTokenOnce", testAdmitConsumesTokenOnce},
		{"AdmitConsumesNonceOnce", testAdmitConsumesNonceOnce},
		{"AdmitRefusals", testAdmitRefusals},
		{"ReclaimAndFind", testReclaimAndFind},
		{"RenewNodeCert", testRenewNodeCert},
		{"SessionsAndCommands", testSessionsAndCommands},
		{"OperatorToken", testOperatorToken},
		{"Machines", testMachines},
		{"RecordBoots", testRecordBoots},
		{"SiteProxy", testSiteProxy},
		{"BootNonces", testBootNonces},
		{"AddBootNonces", testAddBootNonces},
		{"CommandsOnTheMachineTimeline", testCommandsOnTheMachineTimeline},
		{"Deployments", testDeployments},
		{"FindMachineByNodeAndRetire", testFindMachineByNodeAndRetire},
		{"BusyMachineRefusesSpecChanges", testBusyMachineRefusesSpecChanges},
		{"BindingsAreObservations", testBindingsAreObservations},
		{"TPMEnrollments", testTPMEnrollments},
		{"AdmitEnrollsTPM", testAdmitEnrollsTPM},
		{"PoolPolicies", testPoolPolicies},
		{"Releases", testReleases},
		{"DaemonTargetAndArch", testDaemonTargetAndArch},
		{"SectionStatuses", testSectionStatuses},
		{"Rollouts", testRollouts},
		{"Images", testImages},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			if s == nil {
				t.Fatal("open returned no store")
			}
			tc.test(t, s)
		})
	}
}
