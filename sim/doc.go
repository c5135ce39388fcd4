// Package sim is bcd sim: a fleet of machines that is not there, played over the
// real network protocols against a real bcd site and a real better-compute serve.
//
// Each simulated machine runs, in one process with the others but for its
// firmware:
//
//   - firmware, in a child process (bcd sim firmware, at sim's nice value − 10, so
//     that sim's joins, deploys and hashing on two cores do not delay its
//     retransmit timers; firmware.go): DHCP DISCOVER (option 60 PXEClient with its
//     arch, 93, 94, 97 GUID) and the follow-up REQUEST to port 4011, TFTP of the
//     boot file the proxyDHCP names (blksize, tsize), a second DHCP round as iPXE
//     (user class "iPXE"), the per-machine iPXE script over HTTP, and its kernel
//     and initrd;
//   - the ramdisk: the real ramdisk.Agent (the discovery join as role ramdisk with
//     the nonce from the script's kernel line, the session, inventory, deploy.image,
//     the hand-over), with only the hardware replaced: claims are made up, the
//     "disk" is a sparse file or a hashing sink, and the kexec moves the machine on;
//   - the installed OS: the real agent/join (attestor provisioned, with the token and
//     node id the deploy wrote into the simulated root) and the real agent.Session
//     as role node.
//
// What is simulated, and labelled so wherever it appears: the hardware behind the
// BMC (an IPMI-over-LAN server from github.com/bougou/go-ipmi per machine, whose
// chassis is this package's, so the site's real bcx-ipmi plugin drives it over
// RMCP+), the disk (deploy.image streams, hashes and writes the image, but no
// partition table is read and no filesystem is written: the deploy's files go to
// a directory standing for the root filesystem), and the kexec. sim never
// self-updates: the daemon section is reported SectionUnsupported, as the spec says
// of bcd sim and bcd ramdisk.
//
// Addresses: proxyDHCP answers by MAC (chaddr) and broadcasts; TFTP and HTTP see
// clients by IP, and the site attributes an IP to the MAC it last saw there. So every
// machine has its own address, a secondary address on sim's interface (Lab adds
// them in a network namespace of its own), and its own sockets bound to it; only the
// broadcast offers arrive on one shared socket bound to 0.0.0.0:68, where they are
// handed to the machine by transaction id and chaddr.
package sim
