// Package units holds bcd's systemd units and drop-ins, byte for byte as the
// spec gives them: the install script (nodeagent/installscript) writes them on
// a host it sets up, and a deploy (deploy, in the ramdisk) writes bcd.service
// into the stock root it installs the node agent into. They live under agent/
// because node, site and ramdisk code share only through agent/.
package units
