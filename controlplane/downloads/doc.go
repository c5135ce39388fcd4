// Package downloads serves the release binaries the install script and
// self-update fetch: GET {basePath}/downloads/{product}/{version}/{os}-{arch}.
//
// The route is public (the client checks the SHA-256 from the signed release
// manifest, not the transport) and strict, so that nothing else on disk can
// be reached: the product is bcd or bcx-ipmi, the version a semantic version
// with an optional leading v, the os linux and the arch amd64 or arm64. bcd
// answers goreleaser's bare binary bcd_{version}_{os}_{arch}, bcx-ipmi its
// archive bcx-ipmi_{version}_{os}_{arch}.tar.gz. goreleaser names files with
// the version without its leading v, so one leading v of the URL's version is
// dropped for the file name and the blob key: v0.1.0 and 0.1.0 both answer
// bcd_0.1.0_linux_amd64.
//
// A file is looked up in the blob store under {product}/{version}/{file}
// first, then as {dir}/{file}. Only regular files are served: a symlink, even
// one named like a release file, a directory or a device is a 404, as is
// anything that does not match the pattern, including encoded slashes and
// dots. Responses are application/octet-stream with cache-control: public,
// max-age=31536000, immutable, through http.ServeContent (ranges,
// Last-Modified, If-Modified-Since).
//
// Configuring downloads with neither a directory nor a blob store is an
// INVALID_CONFIG error from New.
package downloads
