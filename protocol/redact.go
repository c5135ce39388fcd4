package protocol

import "net/url"

// RedactURL drops what may hold a secret from a URL (userinfo, query, fragment:
// a presigned image URL carries its signature in the query) before it reaches a
// log, a timeline, an error or the api. Every side that shows an image URL calls
// it, so what is hidden is decided once.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
