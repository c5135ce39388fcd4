// Package pluginhost runs bcx plugins for bcd: it finds each in [plugins] dir,
// verifies its binary against the directory's pins file before every start, starts
// it through the sandbox launcher (bmc/sandbox) under its own uid in its own cgroup,
// connects to it with go-plugin over a unix socket under mutual TLS, and supervises
// it: a plugin that exits, stops answering its health check or hangs a call is
// killed and started again with backoff, while the host carries on.
//
// A BMC driver plugin is used through Host.Driver, a bmc.Driver whose calls each get
// a deadline (CallTimeout). A call in flight when its plugin dies fails with a
// bmc.KindPlugin error saying so, and that the BMC's side of it is unknown; the next
// call waits for the restarted plugin.
//
// The plugin's socket lives in a directory under RuntimeDir that the plugin's uid
// owns. bcd's runtime directory is 0700 and the plugin cannot walk into it, so the
// launcher starts in that directory (as root, before it drops to the plugin's uid)
// and the plugin is told to make its socket in "."; the host maps the relative
// address the plugin reports back to the directory.
package pluginhost
