package installscript

import "github.com/better-compute/bcd/agent/units"

// The units and drop-ins the script installs are agent/units', which a deploy
// in the ramdisk writes too; these names keep the script's callers as they were.
const (
	UnitPath               = units.UnitPath
	HelperUnitPath         = units.HelperUnitPath
	DropInDir              = units.DropInDir
	PluginsDropInPath      = units.PluginsDropInPath
	UnprivilegedDropInPath = units.UnprivilegedDropInPath
	UpdateDropInPath       = units.UpdateDropInPath

	BCDUnit            = units.BCDUnit
	PluginsDropIn      = units.PluginsDropIn
	PrivilegedDropIn   = units.PrivilegedDropIn
	HelperUnit         = units.HelperUnit
	UnprivilegedDropIn = units.UnprivilegedDropIn
	UpdateDropIn       = units.UpdateDropIn
)
