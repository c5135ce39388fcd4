package protocol

// Kernel command line parameters: the site agent renders them into a machine's iPXE
// script and bcd ramdisk reads them back from /proc/cmdline, so both sides take the
// names from here. Every value is a single word (no spaces, quotes or control
// characters).
const (
	CmdlineGatewayURL        = "bcd.gateway_url"
	CmdlineServerName        = "bcd.server_name"
	CmdlineSite              = "bcd.site"
	CmdlineServingCAPin      = "bcd.serving_ca_pin"
	CmdlineJoinSigningPin    = "bcd.join_signing_pin"
	CmdlineJoinEncryptionPin = "bcd.join_encryption_pin"
	CmdlineBootNonce         = "bcd.boot_nonce"
	CmdlineProxy             = "bcd.proxy"   // optional: HTTP proxy the ramdisk dials through
	CmdlineWitness           = "bcd.witness" // the site agent's witness URL (WitnessPath)
	CmdlineLog               = "bcd.log"     // optional: log level
)
