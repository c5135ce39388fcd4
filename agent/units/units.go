package units

// The units and drop-ins the script installs, verbatim from the spec ("The
// systemd unit", "The plugin drop-in", "Running bcd node unprivileged"). They
// are constants rather than template output so tests can hand the very same
// bytes to systemd-analyze.
const (
	// UnitPath is where the script installs BCDUnit.
	UnitPath = "/etc/systemd/system/bcd.service"
	// HelperUnitPath is where helper mode installs HelperUnit.
	HelperUnitPath = "/etc/systemd/system/bcd-helper.service"
	// DropInDir holds bcd.service's drop-ins.
	DropInDir = "/etc/systemd/system/bcd.service.d"
	// PluginsDropInPath is the plugin drop-in, present exactly when
	// config.toml has a [plugins] section.
	PluginsDropInPath = DropInDir + "/plugins.conf"
	// UnprivilegedDropInPath is the helper-mode drop-in, present exactly
	// when config.toml has a [helper] section.
	UnprivilegedDropInPath = DropInDir + "/unprivileged.conf"
	// UpdateDropInPath is the self-update drop-in, present exactly when
	// config.toml has an [update] section.
	UpdateDropInPath = DropInDir + "/40-bcd-update.conf"
)

// BCDUnit is bcd.service: bcd node as root, narrowed.
const BCDUnit = `[Unit]
Description=better-compute node agent (bcd)
Documentation=https://github.com/better-compute/better-compute
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=10

[Service]
Type=simple
ExecStart=/usr/local/bin/bcd node --config /etc/bcd/config.toml
Restart=always
RestartSec=5s
UMask=0077
StateDirectory=bcd
StateDirectoryMode=0700
RuntimeDirectory=bcd
RuntimeDirectoryMode=0700
ConfigurationDirectory=bcd
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ReadWritePaths=-/etc/cdi -/var/run/cdi
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
CapabilityBoundingSet=CAP_SYS_BOOT CAP_SYS_ADMIN CAP_SYS_RAWIO CAP_DAC_READ_SEARCH CAP_NET_ADMIN CAP_CHOWN CAP_FOWNER CAP_DAC_OVERRIDE

[Install]
WantedBy=multi-user.target
`

// PluginsDropIn is the first part of plugins.conf, for every plugin node.
const PluginsDropIn = `[Service]
# bcx plugins ([plugins] in /etc/bcd/config.toml): their own uids, their own cgroups.
CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL
Delegate=yes
DelegateSubgroup=main
ProtectControlGroups=no
`

// PrivilegedDropIn follows PluginsDropIn only when [plugins] privileged
// names a plugin.
const PrivilegedDropIn = `# plugins.privileged in /etc/bcd/config.toml: runtime plugins that run VMs as root (Kata).
CapabilityBoundingSet=CAP_MKNOD CAP_SYS_RESOURCE CAP_IPC_LOCK CAP_SYS_NICE CAP_NET_RAW CAP_SYS_CHROOT CAP_FSETID CAP_SETPCAP CAP_SYS_PTRACE
RestrictNamespaces=no
RestrictAddressFamilies=AF_VSOCK AF_PACKET
ProtectKernelModules=no
`

// HelperUnit is bcd-helper.service, the root half of an unprivileged node.
const HelperUnit = `[Unit]
Description=better-compute node agent privileged helper (bcd helper)
Documentation=https://github.com/better-compute/better-compute
Before=bcd.service

[Service]
Type=simple
ExecStart=/usr/local/bin/bcd helper --config /etc/bcd/config.toml
Restart=always
RestartSec=2s
UMask=0077
RuntimeDirectory=bcd-helper
RuntimeDirectoryMode=0755

[Install]
WantedBy=multi-user.target
`

// UnprivilegedDropIn runs bcd.service as the bcd user beside the helper.
const UnprivilegedDropIn = `[Unit]
Requires=bcd-helper.service
After=bcd-helper.service

[Service]
User=bcd
Group=bcd
SupplementaryGroups=systemd-journal adm
`

// UpdateDropIn opens the two directories self-update writes outside
// bcd.service's own: under ProtectSystem=strict even root cannot relink
// /usr/local/bin/bcd to the current slot, nor write bcd-rollback.service
// and bcd.service.d/50-bcd-rollback.conf. The "-" prefix keeps a host
// without one of them starting.
const UpdateDropIn = `[Service]
# Self-update ([update] in /etc/bcd/config.toml): bcd relinks /usr/local/bin/bcd to
# its current slot and writes bcd-rollback.service, which ProtectSystem=strict forbids.
ReadWritePaths=-/usr/local/bin -/etc/systemd/system
`
