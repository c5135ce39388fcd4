// Package ipmi is the bcx-ipmi plugin's driver: bmc.Driver over IPMI v2.0 on the
// LAN (RMCP+, "lanplus"), with github.com/bougou/go-ipmi as a native client.
//
// A native client rather than bmclib's IPMI provider, which runs ipmitool: no child
// process means no password in any environment or argv, a seccomp filter that can
// forbid forking altogether, and about 20 ms per operation against OpenIPMI's
// ipmi_sim instead of ipmitool's 0.3-0.5 s. The cipher suite is set per BMC (3 or
// 17; ipmi_sim needs 3), or left to the client, which picks the strongest the BMC
// lists.
package ipmi
