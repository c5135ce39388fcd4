// Package pins reads a plugin directory's pins file: one "<sha256>  <name>" line per
// plugin, the format sha256sum writes and the install script maintains (spec
// "Installing plugins from the release"). bcd starts a plugin only when the SHA-256
// of its binary equals its line here, checked before every start.
package pins
