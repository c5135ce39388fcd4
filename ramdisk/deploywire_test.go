package ramdisk

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// TestDeployResultWiped: what the deploy removed from the old disk reaches the
// wire result, as "wiped".
func TestDeployResultWiped(t *testing.T) {
	wiped := []string{"gpt", "lvm2 on old partition 2", "md 1.2 on old partition 3"}
	w := deployResult(deploy.Result{Target: deploy.Disk{Path: "/dev/sda"}, Wiped: wiped})
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	var back protocol.DeployImageResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Wiped, wiped) {
		t.Errorf("wire result %s: wiped %q, want %q", b, back.Wiped, wiped)
	}
}
