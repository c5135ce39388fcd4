package operator

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/bcd/controlplane/apitype"
)

// TestImagesCatalog: images add, list (a table and -o json), show and
// delete against an in-process serve, with the URL's credentials never
// shown; machines deploy --image NAME ends in the same deployment as
// machines deploy --url …, and a catalog name with the image's own flags is
// a usage error naming them.
func TestImagesCatalog(t *testing.T) {
	s, _ := controlPlane(t)
	const secretURL = "https://imguser:imgpass@images.example.test/debian-12.raw.zst?X-Amz-Signature=5ec7e7"
	const shownURL = "https://images.example.test/debian-12.raw.zst"
	sha := strings.Repeat("ab", 32)
	add := []string{"images", "add", "debian-12", "--url", secretURL, "--sha256", sha, "--size", "1048576", "--format", "raw.zst", "--image-size", "4194304"}
	for name, args := range map[string][]string{
		"no --url":         {"images", "add", "x", "--sha256", sha, "--size", "1", "--format", "raw"},
		"no --format":      {"images", "add", "x", "--url", shownURL, "--sha256", sha, "--size", "1"},
		"short sha256":     {"images", "add", "x", "--url", shownURL, "--sha256", "abc", "--size", "1", "--format", "raw"},
		"bad format":       {"images", "add", "x", "--url", shownURL, "--sha256", sha, "--size", "1", "--format", "vmdk"},
		"ftp url":          {"images", "add", "x", "--url", "ftp://images.example.test/x", "--sha256", sha, "--size", "1", "--format", "raw"},
		"no --image-size":  {"images", "add", "x", "--url", shownURL, "--sha256", sha, "--size", "1", "--format", "raw.zst"},
		"bad name":         {"images", "add", "Debian 12", "--url", shownURL, "--sha256", sha, "--size", "1", "--format", "raw"},
		"show without arg": {"images", "show"},
	} {
		if code, out, errOut := runCLI(t, "", args...); code != 2 || strings.Contains(out+errOut, "imgpass") {
			t.Errorf("%s: exit %d %s %s, want 2", name, code, out, errOut)
		}
	}
	code, out, errOut := runCLI(t, "", add...)
	if code != 0 || out != "image debian-12 added: "+shownURL+" (raw.zst, 1048576 bytes, sha256 "+sha+")\n" {
		t.Fatalf("images add: %d %q %s", code, out, errOut)
	}
	if code, _, errOut = runCLI(t, "", add...); code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") || !strings.Contains(errOut, "debian-12") {
		t.Errorf("images add of a name taken: %d %s", code, errOut)
	}
	if code, _, errOut = runCLI(t, "", "images", "add", "alma-9", "--url", "https://images.example.test/alma-9.raw", "--sha256", strings.Repeat("cd", 32),
		"--size", "4096", "--format", "raw"); code != 0 {
		t.Fatalf("images add alma-9: %d %s", code, errOut)
	}
	code, out, _ = runCLI(t, "", "images", "list")
	if code != 0 || !regexp.MustCompile(`(?m)^NAME\s+FORMAT\s+SIZE\s+IMAGE SIZE\s+SHA256\s+URL\s+CREATED$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^alma-9\s+raw\s+4096\s+-\s+cdcdcdcdcdcd\s+https://images.example.test/alma-9.raw\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^debian-12\s+raw.zst\s+1048576\s+4194304\s+abababababab\s+`+regexp.QuoteMeta(shownURL)+`\s`).MatchString(out) ||
		strings.Index(out, "alma-9") > strings.Index(out, "debian-12") || strings.Contains(out, "imgpass") || strings.Contains(out, "5ec7e7") {
		t.Errorf("images list: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "", "images", "list", "-o", "json")
	var list []apitype.Image
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 || list[1].URL != shownURL || list[1].ImageSize != 4194304 ||
		strings.Contains(out, "imgpass") || strings.Contains(out, "5ec7e7") {
		t.Errorf("images list -o json: %d %s", code, out)
	}
	code, out, _ = runCLI(t, "", "images", "show", "debian-12")
	for _, want := range []string{"NAME:", "debian-12", "URL:", shownURL, "SHA256:", sha, "SIZE:", "1048576", "FORMAT:", "raw.zst", "IMAGE SIZE:", "4194304"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("images show lacks %q: %d\n%s", want, code, out)
		}
	}
	if strings.Contains(out, "imgpass") || strings.Contains(out, "5ec7e7") {
		t.Errorf("images show shows the URL's credentials:\n%s", out)
	}
	if code, _, errOut = runCLI(t, "", "images", "show", "nope"); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("images show nope: %d %s", code, errOut)
	}

	// Deploy by name and by URL: the same deployment.
	if code, _, errOut = runCLI(t, "", "sites", "create", "fsn1"); code != 0 {
		t.Fatalf("sites create: %d %s", code, errOut)
	}
	for _, m := range [][2]string{{"byurl", "52:54:00:00:01:01"}, {"byname", "52:54:00:00:01:02"}} {
		if code, _, errOut = runCLI(t, "", "machines", "add", "--site", "fsn1", "--name", m[0], "--mac", m[1]); code != 0 {
			t.Fatalf("machines add %s: %d %s", m[0], code, errOut)
		}
	}
	for _, extra := range [][]string{{"--sha256", sha}, {"--size", "1", "--format", "raw"}, {"--url", shownURL}} {
		args := append([]string{"machines", "deploy", "byname", "--image", "debian-12"}, extra...)
		code, _, errOut = runCLI(t, "", args...)
		if code != 2 || !strings.Contains(errOut, "--image debian-12 is a catalog entry") || !strings.Contains(errOut, "drop "+extra[0]) {
			t.Errorf("deploy --image NAME %v: %d %s", extra, code, errOut)
		}
	}
	if code, _, errOut = runCLI(t, "", "machines", "deploy", "byname", "--image", shownURL, "--url", shownURL, "--sha256", sha, "--size", "1"); code != 2 ||
		!strings.Contains(errOut, "give the image's URL once") {
		t.Errorf("deploy --image URL --url URL: %d %s", code, errOut)
	}
	if code, _, errOut = runCLI(t, "", "machines", "deploy", "byname", "--image", "debian-13"); code != 1 || !strings.Contains(errOut, "NOT_FOUND") ||
		!strings.Contains(errOut, "debian-13") {
		t.Errorf("deploy of a name not in the catalog: %d %s", code, errOut)
	}
	deployed := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(t, "", append([]string{"machines", "deploy"}, args...)...)
		if code != 0 || !regexp.MustCompile(`^dep_[0-9a-z]{26}\n$`).MatchString(out) || strings.Contains(errOut, "imgpass") {
			t.Fatalf("machines deploy %v: %d %q %s", args, code, out, errOut)
		}
		return strings.TrimSpace(out)
	}
	byURL := deployed("byurl", "--url", secretURL, "--sha256", strings.ToUpper(sha), "--size", "1048576", "--format", "raw.zst", "--image-size", "4194304",
		"--disk-serial", "S1", "--pool", "gpu")
	byName := deployed("byname", "--image", "debian-12", "--disk-serial", "S1", "--pool", "gpu")
	da, err := s.Store().GetDeployment(context.Background(), byURL)
	if err != nil {
		t.Fatal(err)
	}
	dn, err := s.Store().GetDeployment(context.Background(), byName)
	if err != nil || !reflect.DeepEqual(dn.Spec, da.Spec) || dn.Spec.Image.URL != secretURL || dn.Step != da.Step {
		t.Errorf("by URL %+v %s\nby name %+v %s (%v)", da.Spec, da.Step, dn.Spec, dn.Step, err)
	}
	code, out, _ = runCLI(t, "", "machines", "show", "byname")
	if code != 0 || !strings.Contains(out, shownURL) || strings.Contains(out, "imgpass") {
		t.Errorf("machines show byname: %d\n%s", code, out)
	}

	// A delete is always safe: the running deployment has its copy.
	if code, out, errOut = runCLI(t, "", "images", "delete", "debian-12"); code != 0 || out != "image debian-12 deleted\n" {
		t.Errorf("images delete: %d %q %s", code, out, errOut)
	}
	if code, _, errOut = runCLI(t, "", "images", "delete", "debian-12"); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("images delete again: %d %s", code, errOut)
	}
	if d, err := s.Store().GetDeployment(context.Background(), byName); err != nil || !reflect.DeepEqual(d.Spec, dn.Spec) {
		t.Errorf("the deployment after the delete: %+v %v", d.Spec, err)
	}
	if code, out, _ = runCLI(t, "", "images", "list", "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Name != "alma-9" {
		t.Errorf("images list after the delete: %d %s", code, out)
	}
}
