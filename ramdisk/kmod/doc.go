// Package kmod loads the kernel modules a machine's hardware needs, the way udev and
// modprobe would on an installed system, for a ramdisk that has neither: it reads
// depmod's index (modules.dep, modules.alias, modules.softdep, modules.builtin),
// matches every /sys/devices/**/modalias against the alias patterns (fnmatch
// globs), orders what matched after its dependencies and pre-softdeps, and inserts
// each with finit_module(2), decompressing .ko.xz and .ko.zst in memory. It repeats
// until a round finds nothing new, since a bus driver (virtio_pci) brings devices
// (virtio-net, virtio-blk) that need drivers of their own.
//
// Module names are normalized (- read as _), softdeps are honoured (u-root's
// kmodule ignores them), and two are added: crc32c before ext4, and the nls
// codepages before vfat.
package kmod
