package agent

// SetFailSend makes the session's live sends fail, nothing written and the
// connection left up, while fail returns true.
func (s *Session) SetFailSend(fail func() bool) { s.failSend = fail }
