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
// Operator (Authorization: Bearer bcop_…; 401 UNAUTHENTICATED otherwise):
//
//	POST   {basePath}/api/v1/tokens                 TokenCreate → 201 TokenCreated
//	GET    {basePath}/api/v1/tokens                 TokenList
//	POST   {basePath}/api/v1/tokens/{id}/revoke     TokenInfo
//	POST   {basePath}/api/v1/sites                  SiteCreate → 201 store.Site
//	GET    {basePath}/api/v1/sites                  SiteList
//	GET    {basePath}/api/v1/nodes                  NodeList
//	GET    {basePath}/api/v1/nodes/{id}             NodeInfo
//	DELETE {basePath}/api/v1/nodes/{id}             NodeInfo (the node is revoked; its session ends)
//	POST   {basePath}/api/v1/nodes/{id}/cordon      NodeInfo
//	POST   {basePath}/api/v1/nodes/{id}/uncordon    NodeInfo
//	POST   {basePath}/api/v1/nodes/{id}/commands    CommandCreate → 201 store.Command
//	GET    {basePath}/api/v1/commands/{id}          store.Command
//
// Bodies are JSON both ways; unknown fields are refused. Every refusal is a
// protocol.ErrorResponse: INVALID_INPUT (400), UNAUTHENTICATED (401),
// NOT_FOUND (404), ALREADY_EXISTS (409), NODE_REVOKED (403) for a deleted
// node, UNSUPPORTED (422) for a command kind the node's role does not run,
// UNAVAILABLE (503, retryable) when the store fails.
//
// The operator token is compared by its SHA-256, in constant time, with the
// hashes in the store; the token itself is never stored or logged.
package api
