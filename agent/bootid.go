package agent

import (
	"fmt"
	"os"
	"strings"
)

// BootIDPath is where Linux publishes a random id that changes on every boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID reads the current boot id. A node.reboot is judged by it: the same id
// after the agent restarts means the machine did not reboot.
func BootID() (string, error) {
	b, err := os.ReadFile(BootIDPath)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("boot id: %s is empty", BootIDPath)
	}
	return id, nil
}
