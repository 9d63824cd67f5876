package sdktest

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestExportImportRestore carries a file of a stopped workspace through an
// artifact into a new workspace of the same deployment.
func TestExportImportRestore(t *testing.T) {
	d := uptest.Shared(t)
	token := d.Project(t)
	c := sdk.New(d.URL+"/", token)
	t.Cleanup(c.Close)
	transfers := ctrlv1connect.NewTransferServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
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

	// An import whose Transfer is deleted before its upload ends fails.
	paused := &pausedReader{Reader: bytes.NewReader(art.Bytes()), at: int64(art.Len() / 2), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		tr, err := c.ImportTransfer(t.Context(), paused)
		if err == nil {
			err = fmt.Errorf("imported as %s", tr.GetState())
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for id := ""; id == ""; {
		list, err := transfers.ListTransfers(t.Context(), connect.NewRequest(&ctrlv1.ListTransfersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range list.Msg.GetTransfers() {
			if tr.GetState() == ctrlv1.TransferState_TRANSFER_STATE_IMPORTING {
				id = tr.GetTransferId()
			}
		}
		if id == "" && time.Now().After(deadline) {
			t.Fatal("no IMPORTING transfer")
		}
		if id != "" {
			if _, err := transfers.DeleteTransfer(t.Context(), connect.NewRequest(&ctrlv1.DeleteTransferRequest{Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, TransferId: id})); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(paused.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "not IMPORTED") {
		t.Errorf("an import deleted midway: %v", err)
	}
}

// pausedReader reads like Reader but, on its second pass (after a seek
// back), blocks at offset at until release is closed.
type pausedReader struct {
	*bytes.Reader
	at      int64
	passes  int
	release chan struct{}
}

func (r *pausedReader) Seek(offset int64, whence int) (int64, error) {
	r.passes++
	return r.Reader.Seek(offset, whence)
}

func (r *pausedReader) Read(p []byte) (int, error) {
	pos := r.Size() - int64(r.Len())
	if r.passes > 0 && pos >= r.at {
		<-r.release
	}
	if r.passes > 0 && pos < r.at && pos+int64(len(p)) > r.at {
		p = p[:r.at-pos]
	}
	return r.Reader.Read(p)
}
