// Package bmc is how a site agent drives its machines' BMCs: power on, off, cycle
// and reset, the next boot device, and what the BMC says about itself.
//
// The Driver interface is plain Go. The IPMI driver runs out of process, as the
// sandboxed bcx-ipmi plugin (plugins/bcx-ipmi): bmc/bmcplugin carries the interface
// over go-plugin's gRPC, bmc/pluginhost starts, verifies and supervises plugins, and
// bmc/sandbox confines them. Nothing outside those packages sees gRPC.
//
// The command kinds bmc.power, bmc.bootdev and bmc.inventory are decoded by the
// site agent (site/bmcexec.go), which calls a Driver: this package knows no
// command or wire vocabulary beyond the bmc_hosts section it stores.
//
// The BMCs and their credentials come from the site's desired state (the bmc_hosts
// section) and are kept by Store in bmc-hosts.json under data_dir, mode 0600, each
// password sealed under the keyring bmc-hosts.key beside it, so the file alone (a
// backup, a copy) yields none.
// Passwords travel only inside Host values, whose Password is a Secret: formatting
// or logging one prints "[redacted]", so a password reaches no log line or error
// message, and no process's argv (the plugin receives it over its gRPC channel).
package bmc
