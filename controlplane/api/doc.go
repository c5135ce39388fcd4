// Package api is the control plane's HTTP api: the public bootstrap document
// and downloads, and the operator api behind a bearer token.
//
// # Routes
//
// Public:
//
//	GET  /.well-known/better-compute                  protocol.WellKnown (also under {basePath})
//	GET  {basePath}/downloads/{product}/{version}/{os}-{arch}   (when downloads are configured)
//
// Operator (Authorization: Bearer bcop_…; 401 UNAUTHENTICATED otherwise),
// with the bodies of package apitype:
//
//	POST   {basePath}/api/v1/tokens                 TokenCreate → 201 TokenCreated
//	GET    {basePath}/api/v1/tokens                 TokenList
//	POST   {basePath}/api/v1/tokens/{id}/revoke     TokenInfo
//	POST   {basePath}/api/v1/sites                  SiteCreate → 201 Site
//	GET    {basePath}/api/v1/sites                  SiteList
//	POST   {basePath}/api/v1/images                 ImageCreate → 201 Image (a catalog entry; URL redacted)
//	GET    {basePath}/api/v1/images                 ImageList (by name; URLs redacted)
//	GET    {basePath}/api/v1/images/{name}          Image (URL redacted)
//	DELETE {basePath}/api/v1/images/{name}          Image (as it was; deployments keep their copy)
//	GET    {basePath}/api/v1/nodes                  NodeList
//	GET    {basePath}/api/v1/nodes/{id}             NodeInfo
//	DELETE {basePath}/api/v1/nodes/{id}             NodeInfo (the node is revoked; its session ends)
//	POST   {basePath}/api/v1/nodes/{id}/cordon      NodeInfo
//	POST   {basePath}/api/v1/nodes/{id}/uncordon    NodeInfo
//	POST   {basePath}/api/v1/nodes/{id}/commands    CommandCreate → 201 Command
//	GET    {basePath}/api/v1/commands/{id}          Command (files' content redacted)
//	PUT    {basePath}/api/v1/sites/{name}/http-proxy  HTTPProxySet → Site
//	DELETE {basePath}/api/v1/sites/{name}/http-proxy  Site
//	POST   {basePath}/api/v1/machines               MachineCreate → 201 MachineInfo
//	GET    {basePath}/api/v1/machines[?site=S]      MachineList
//	GET    {basePath}/api/v1/machines/{m}           MachineInfo
//	DELETE {basePath}/api/v1/machines/{m}           MachineInfo (as it was)
//	PUT    {basePath}/api/v1/machines/{m}/boot      MachineBoot → MachineInfo
//	PUT    {basePath}/api/v1/machines/{m}/bmc       MachineBMCInput → MachineInfo
//	DELETE {basePath}/api/v1/machines/{m}/bmc       MachineInfo
//	POST   {basePath}/api/v1/machines/{m}/approve   MachineInfo
//	GET    {basePath}/api/v1/machines/{m}/events[?limit=N]  MachineEventList
//	POST   {basePath}/api/v1/machines/{m}/power     MachinePower → 201 Command (bmc.power)
//	POST   {basePath}/api/v1/machines/{m}/bootdev   MachineBootdev → 201 Command (bmc.bootdev)
//	POST   {basePath}/api/v1/machines/{m}/inventory 201 Command (inventory)
//	POST   {basePath}/api/v1/machines/{m}/deploy    DeployCreate → 201 DeployCreated (a deployment; image_name
//	                                                resolved from the catalog and copied into it)
//	POST   {basePath}/api/v1/machines/{m}/cancel    MachineInfo (the deployment stopped: failed)
//	PUT    {basePath}/api/v1/machines/{m}/firmware  MachineFirmware → MachineInfo
//	PUT    {basePath}/api/v1/machines/{m}/tpm       MachineTPMSet → MachineInfo (its TPM's EK enrolled)
//	DELETE {basePath}/api/v1/machines/{m}/tpm       MachineInfo (its EK no longer enrolled)
//	POST   {basePath}/api/v1/tpm/enrollments        TPMEnrollmentCreate → 201 TPMEnrollment (allow-list entry)
//	GET    {basePath}/api/v1/tpm/enrollments        TPMEnrollmentList
//	DELETE {basePath}/api/v1/tpm/enrollments/{ek}   TPMEnrollment (as it was; revoked)
//	GET    {basePath}/api/v1/pools                  PoolPolicyList (pools with a policy)
//	GET    {basePath}/api/v1/pools/{pool}/policy    PoolPolicy (no attestors listed: any)
//	PUT    {basePath}/api/v1/pools/{pool}/policy    PoolPolicySet → PoolPolicy
//
// {m} is a machine's id (m_…), one of its MACs (any spelling), or its name
// when that names one machine across sites. POST /sites takes approval
// (auto, the default, or manual).
//
// # Machines and their agents
//
// A change to a machine's boot mode or BMC, adding or deleting it, and a
// site's proxy tell the gateway (Notifier.SpecChanged) to push the site's
// agents their new spec. A machine's BMC password is accepted and kept but
// never answered: MachineInfo shows bmc.has_password.
//
// power and bootdev go to a connected site agent of the machine's site (the
// one seen last; none connected is UNAVAILABLE), inventory to the machine's
// ramdisk node, which must be connected. The caller waits for a command's
// outcome by reading it (client.WaitCommand).
//
// deploy starts a deployment that the lifecycle (the Lifecycle interface,
// package lifecycle) runs from PXE boot to provisioned or failed; it answers
// the machine in the state it starts in and the deployment. A machine whose
// deployment runs refuses another (ALREADY_EXISTS) until cancel; after
// must be kexec or reboot, since a deployment ends with the installed OS
// running. Each deploy.image the lifecycle sends carries, in its files, a
// fresh node id and a single-use join token bound to it and to the machine
// (role node, the machine's site, pool DefaultPool unless given), with
// /etc/bcd/config.toml, join-encryption.jwk and node-id (0600, root). The
// agent gets them whole; every api read of a command shows each file's path,
// mode and size, never its content, and a deployment's image URL is shown
// without userinfo, query or fragment. GET of one machine includes its latest
// deployment.
//
// # TPM enrollments and pool policies
//
// The tpm attestor admits an enrolled endorsement key (its SHA-256, {ek}):
// a machine's (PUT …/machines/{m}/tpm, through machines.Service: part of
// the machine's spec, on its timeline) or an allow-list entry of a site and
// pool. Revoking a machine's EK goes through the Service too. A pool's
// policy lists the attestors a join into it may use (join-token,
// provisioned, discovery, tpm); a join with another is refused
// ATTESTOR_NOT_ALLOWED.
//
// Handlers never answer with a store row: convert.go turns rows into
// apitype resources in one place, and that is where a BMC password becomes
// has_password and the redactions above happen.
//
// Bodies are JSON both ways; unknown fields are refused. Every refusal is a
// protocol.ErrorResponse (domain packages return a refusal.Refusal, which
// httpjson maps here): INVALID_INPUT (400), UNAUTHENTICATED (401),
// NOT_FOUND (404), ALREADY_EXISTS (409; a MAC or machine name taken, a
// deployment already running), MACHINE_BUSY (409; a spec change, manual BMC
// command or delete of a machine whose deployment runs: machines.Service),
// NODE_REVOKED (403) for a deleted node, UNSUPPORTED (422) for a command kind
// the node's role does not run, UNAVAILABLE (503, retryable) when the store
// fails or the agent a machine command needs is not connected.
//
// The operator token is compared by its SHA-256, in constant time, with the
// hashes in the store; the token itself is never stored or logged.
package api
