package sdktest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/sdk"
)

// TestExportImportRestore carries a file of a stopped workspace through an
// artifact into a new workspace of the same deployment.
func TestExportImportRestore(t *testing.T) {
	c := newClient(t)
	ws, err := c.CreateWorkspace(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, ws, "echo carried > /root/note && chmod 0600 /root/note")
	if _, err := ws.Export(t.Context(), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "AVAILABLE") {
		t.Fatalf("export of a running workspace: %v", err)
	}
	if _, err := c.StopWorkspace(t.Context(), ws.ID(), sdk.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	var art bytes.Buffer
	exported, err := ws.Export(t.Context(), &art)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(art.Len()) != exported.GetManifest().GetSizeBytes() {
		t.Errorf("wrote %d bytes of a %d-byte artifact", art.Len(), exported.GetManifest().GetSizeBytes())
	}
	// With the template the artifact carries its image too.
	var withTemplate bytes.Buffer
	carried, err := ws.ExportWithTemplate(t.Context(), &withTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if !carried.GetManifest().GetCarriesTemplate() || withTemplate.Len() <= art.Len() {
		t.Errorf("export with the template: %d bytes (%d without), manifest %v", withTemplate.Len(), art.Len(), carried.GetManifest())
	}
	imported, err := c.ImportTransfer(t.Context(), bytes.NewReader(art.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	restored, err := c.Restore(t.Context(), imported.GetTransferId())
	if err != nil {
		t.Fatal(err)
	}
	if restored.ID() == ws.ID() {
		t.Error("the restored workspace kept the exported one's ID")
	}
	if got := sh(t, restored, "stat -c %a /root/note; cat /root/note"); got != "600\ncarried\n" {
		t.Errorf("restored file: %q", got)
	}
	if _, err := c.ImportTransfer(t.Context(), strings.NewReader("not an artifact")); err == nil || !strings.Contains(err.Error(), "not zstd-compressed") {
		t.Errorf("import of a foreign file: %v", err)
	}
}
