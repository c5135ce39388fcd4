// Package deploy carries out the ramdisk's deploy.image. It takes a Request, its
// own type (the ramdisk converts the wire's protocol.DeployImageParams), and
// streams a disk image over HTTP(S) (raw, gzip, xz, zstd or qcow2), hashes the
// served bytes, and decompresses and writes them in one pass with bounded memory: a reader runs ahead of the writers on a ring of 4 MiB buffers,
// writes go out with O_DIRECT where the device takes it, and zero blocks are
// skipped on a target zeroed first (BLKZEROOUT where the device offloads it, or a
// fresh sparse file). The first MiB of the image (protective MBR and primary GPT)
// is held back until the SHA-256 and the size check out, and any failure wipes the
// first and last MiB of the disk, so a half-written image never boots.
//
// Before anything is written, the disk's old partition table is read (the backup
// GPT when the primary is damaged, an MBR's logical partitions through its EBRs)
// and the first and last MiB of every old partition are zeroed, then the disk's
// own ends: the installed OS then finds no stale md array (superblocks 0.90, 1.0,
// 1.1, 1.2), LVM physical volume or filesystem on partitions the new image does
// not cover, such as old ones past a smaller image's end. Result.Wiped (the wire
// result's wiped) names what was found: "gpt", "lvm2 on old partition 2",
// "md 1.2 on old partition 3".
//
// A qcow2 image (version 2 or 3, deflate- or zstd-compressed clusters) is
// converted as it streams, with no copy of the file: each data cluster goes to
// its guest offset once the L2 table that maps it has been read, and clusters
// that arrive before their table are held in memory up to Deployer.QCOW2Hold
// (64 MiB). The header's virtual size is the image size (image_size, when given,
// must equal it). Refused, with the reason in the error: a backing file, an
// encrypted image, an external data file, extended L2 entries, unknown
// incompatible features (all before the disk is opened), and a layout that needs
// more than the bound (during the write: the disk is wiped).
//
// Once the image is good, Deploy re-reads the partition table (BLKRRPART, and its
// own GPT reader, which works on image files and on kernels without partition
// support), moves the backup GPT to the end of a disk larger than the image, and
// finds:
//
//   - the root filesystem: root_partition if given; else the first partition of
//     GPT type Linux root (x86-64 or arm64); else a Linux filesystem partition
//     named "root" or whose ext label is "root"; else the ext filesystem holding
//     /etc/os-release. It must be ext2/3/4 without a journal awaiting recovery.
//   - the ESP: esp_partition if given, else the first partition of the ESP type
//     (MBR type 0xef).
//
// It writes the request's files into them without mounting anything: debugfs for
// ext2/3/4 (go-diskfs corrupts indexed directories) and mtools for FAT (FAT12,
// FAT16 and FAT32), at the partitions' byte offsets in the whole disk. Missing
// directories are made 0755 root; an existing file or symlink at a path is
// replaced; e2fsck -fn checks the root filesystem afterwards.
//
// For a kexec it loads the installed kernel, read back the same way: after.kernel
// and after.initrd when given; else a Boot Loader Specification entry on the ESP
// (loader.conf's default, else the highest version; several initrds are
// concatenated); else /boot/vmlinuz, /vmlinuz (Debian's symlinks, followed) or the
// highest /boot/vmlinuz-VERSION with its initrd.img-VERSION or
// initramfs-VERSION.img. The command line is after.cmdline, else the entry's
// options, else /boot/bcd-cmdline or /etc/kernel/cmdline in the root filesystem,
// else root=PARTUUID=<root> ro with the ramdisk's console= parameters. Unified
// kernel images and GRUB configurations are not read. Deploy only loads the
// kernel: the caller reports success, then Finish jumps (or reboots, or powers
// off).
//
// Every tool runs from PATH (debugfs, e2fsck, mdir, mmd, mcopy, and xz when
// present, else a pure-Go decoder); a missing one is an error naming it. Secrets
// in the request (the join token) travel only in 0600 files inside a private temp
// directory, never on a command line or in a log.
package deploy
