package agent

import (
	"encoding/json"
	"fmt"

	"github.com/better-compute/bcd/protocol"
)

// ReportSection journals and sends how the agent applies a section of its spec:
// an Event of kind section.status whose Data is st. Like every event it is
// replayed until acknowledged, so the last report survives a restart.
func (s *Session) ReportSection(st protocol.SectionStatus) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	level, msg := "info", fmt.Sprintf("%s section %s", st.Section, st.State)
	if st.State == protocol.SectionFailed || st.State == protocol.SectionUnsupported {
		level = "warn"
	}
	if st.Message != "" {
		msg += ": " + st.Message
	}
	return s.Event(protocol.Event{Kind: protocol.EventSectionStatus, Level: level, Message: msg, Data: data})
}

// ReportDaemonUnsupported answers a daemon section in spec with
// SectionUnsupported, for a mode that runs without self-update (bcd ramdisk):
// the control plane then knows the section will never be applied there.
func (s *Session) ReportDaemonUnsupported(spec protocol.Spec) {
	raw, ok := spec.Sections[protocol.SectionDaemon]
	if !ok {
		return
	}
	var sec protocol.DaemonSection
	_ = json.Unmarshal(raw, &sec) // the version is only for the report
	st := protocol.SectionStatus{
		Section: protocol.SectionDaemon, Revision: spec.Revision, State: protocol.SectionUnsupported,
		Reason: ReasonUnsupported, Version: sec.Version,
		Message: fmt.Sprintf("bcd %s runs without self-update", s.Identity.Role),
	}
	if err := s.ReportSection(st); err != nil {
		s.log().Error("could not journal a section status", "section", st.Section, "error", err.Error())
	}
}
