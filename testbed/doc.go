// Package testbed builds a lab on one machine, as root: network namespaces with a
// bridge, taps, QEMU VMs (SeaBIOS + iPXE ROM or OVMF) whose NICs sit on the bridge,
// an ordinary site DHCP server (dnsmasq, addresses only) and small initramfs images.
// Nothing it starts can send a packet outside the namespaces it creates: VMs get
// `-nic none` unless they have a tap on a namespace's bridge, and every server binds
// inside a namespace.
//
// Tests use it to prove the boot path with real firmware; `make demo` uses it to run
// the whole fleet flow. Everything it starts it stops, by PID, in Close.
package testbed
