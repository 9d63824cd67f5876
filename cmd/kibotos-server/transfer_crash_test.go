package main

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// TestTransferCrashTable kills `kibotos up` during an export, an import
// and a restore, at several points, and checks after each restart that
// every Transfer is truthful (finished, or FAILED at its stage), that a
// COMPLETE or IMPORTED one holds its whole artifact and a restored
// workspace its data, that the blob store holds nothing else, and, once
// every Transfer is deleted, nothing at all.
func TestTransferCrashTable(t *testing.T) {
	// seed is a stopped workspace with 16 MiB of random data on its
	// Volume.
	seed := func(d *deployment) *seeded {
		s := &seeded{ws: d.createWorkspace(true)}
		s.vol = d.workspace(s.ws).Spec.GetVolume().GetVolumeId()
		s.digest = d.cli("ws", "exec", s.ws, "--", "sh", "-c", "head -c 16777216 /dev/urandom > /data/blob && sync && sha256sum /data/blob")
		d.cli("ws", "stop", s.ws, "--wait")
		s.artifact = filepath.Join(d.t.TempDir(), "ws.kbt")
		return s
	}
	// exported is seed, exported once to s.artifact (that Transfer
	// deleted).
	exported := func(d *deployment) *seeded {
		s := seed(d)
		d.cli("ws", "export", s.ws, "-o", s.artifact)
		for _, tr := range d.transfersNow() {
			d.cli("transfer", "delete", tr.TransferId)
		}
		return s
	}
	rows := []crashPoint{{
		name:   "export",
		delays: []time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond},
		seed:   seed,
		begin: func(d *deployment, s *seeded) {
			d.background("ws", "export", s.ws, "-o", s.artifact)
		},
		recovered: func(d *deployment, s *seeded) {
			d.settledTransfers(ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE)
			// The workspace was left as it was: it starts, its data whole.
			d.cli("ws", "start", s.ws, "--wait")
			if got := d.cli("ws", "exec", s.ws, "--", "sha256sum", "/data/blob"); got != s.digest {
				d.t.Errorf("the volume's data reads %q, want %q", got, s.digest)
			}
			d.cli("ws", "stop", s.ws, "--wait")
		},
	}, {
		name:   "import",
		delays: []time.Duration{30 * time.Millisecond, 200 * time.Millisecond, 600 * time.Millisecond},
		seed:   exported,
		begin: func(d *deployment, s *seeded) {
			d.background("transfer", "import", s.artifact)
		},
		recovered: func(d *deployment, s *seeded) {
			d.settledTransfers(ctrlv1.FailureStage_FAILURE_STAGE_IMPORTING_TRANSFER)
		},
	}, {
		name:   "restore",
		delays: []time.Duration{100 * time.Millisecond, 600 * time.Millisecond, 1500 * time.Millisecond},
		seed:   exported,
		begin: func(d *deployment, s *seeded) {
			var imp ctrlv1.ImportTransferResponse
			if err := protojson.Unmarshal([]byte(d.cli("transfer", "import", s.artifact, "-o", "json")), &imp); err != nil {
				d.t.Fatal(err)
			}
			var rr ctrlv1.RestoreWorkspaceResponse
			if err := protojson.Unmarshal([]byte(d.cli("transfer", "restore", imp.Transfer.TransferId, "-o", "json")), &rr); err != nil {
				d.t.Fatal(err)
			}
			d.ids = append(d.ids, rr.Workspace.WorkspaceId, rr.Workspace.Spec.GetVolume().GetVolumeId())
		},
		recovered: func(d *deployment, s *seeded) {
			for _, tr := range d.settledTransfers(ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE) {
				if tr.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORED {
					continue
				}
				if got := d.cli("ws", "exec", tr.RestoredWorkspaceId, "--", "sha256sum", "/data/blob"); got != s.digest {
					d.t.Errorf("the restored volume reads %q, want %q", got, s.digest)
				}
			}
			d.checkNoTemporaries()
		},
	}}
	runCrashTable(t, withTransfersDeleted(rows))
}

// withTransfersDeleted ends each row by deleting its Transfers and
// checking that the blob store is then empty.
func withTransfersDeleted(rows []crashPoint) []crashPoint {
	for i := range rows {
		recovered := rows[i].recovered
		rows[i].recovered = func(d *deployment, s *seeded) {
			recovered(d, s)
			for _, tr := range d.transfersNow() {
				d.cli("transfer", "delete", tr.TransferId)
			}
			for _, tr := range d.transfersNow() {
				d.t.Errorf("transfer %s is %v after DeleteTransfer", tr.TransferId, tr.State)
			}
			if files := d.blobFiles(); len(files) > 0 {
				d.t.Errorf("blobs left once every transfer is deleted: %v", files)
			}
		}
	}
	return rows
}

func (d *deployment) transfers() ctrlv1connect.TransferServiceClient {
	return ctrlv1connect.NewTransferServiceClient(http.DefaultClient, "http://"+d.up.addr, d.auth())
}

// transfersNow lists the Transfers that are not DELETED.
func (d *deployment) transfersNow() []*ctrlv1.Transfer {
	resp, err := d.transfers().ListTransfers(context.Background(), connect.NewRequest(&ctrlv1.ListTransfersRequest{PageSize: 1000}))
	if err != nil {
		d.t.Fatal(err)
	}
	return resp.Msg.Transfers
}

// settledTransfers waits until no Transfer is at work and checks each:
// COMPLETE, IMPORTED or RESTORED holding its whole artifact, or FAILED at
// stage; and that the blob store holds exactly the artifacts of those that
// hold one. It returns them.
func (d *deployment) settledTransfers(stage ctrlv1.FailureStage) []*ctrlv1.Transfer {
	d.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var list []*ctrlv1.Transfer
	for {
		list = d.transfersNow()
		working := false
		for _, tr := range list {
			switch tr.State {
			case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
				ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_DELETING:
				working = true
			}
		}
		if !working {
			break
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("transfers still at work after a restart: %v", list)
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := map[string]bool{}
	for _, tr := range list {
		d.t.Logf("after the kill: transfer %s %v %s", tr.TransferId, tr.State, tr.Failure.GetMessage())
		switch tr.State {
		case ctrlv1.TransferState_TRANSFER_STATE_COMPLETE, ctrlv1.TransferState_TRANSFER_STATE_IMPORTED,
			ctrlv1.TransferState_TRANSFER_STATE_RESTORED:
			want[filepath.Join(d.home, "blobs", "transfers", tr.TransferId)] = true
			fi, err := os.Stat(filepath.Join(d.home, "blobs", "transfers", tr.TransferId))
			if err != nil || uint64(fi.Size()) != tr.Manifest.GetSizeBytes() {
				d.t.Errorf("transfer %s is %v but its artifact is %v, %v; want %d bytes", tr.TransferId, tr.State, fi, err, tr.Manifest.GetSizeBytes())
			}
		case ctrlv1.TransferState_TRANSFER_STATE_FAILED:
			if tr.Failure.GetStage() != stage || tr.Failure.GetMessage() == "" {
				d.t.Errorf("transfer %s FAILED with %v, want stage %v and a message", tr.TransferId, tr.Failure, stage)
			}
		default:
			d.t.Errorf("transfer %s is %v after a restart", tr.TransferId, tr.State)
		}
	}
	// Collection runs in the loop: wait for the blobs of what failed to go.
	for {
		extra := []string{}
		for _, f := range d.blobFiles() {
			if !want[f] {
				extra = append(extra, f)
			}
		}
		if len(extra) == 0 {
			break
		}
		if time.Now().After(deadline) {
			d.t.Errorf("blobs no transfer holds: %v", extra)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return list
}

// blobFiles lists the files of the deployment's blob store but the one
// that names its deployment.
func (d *deployment) blobFiles() []string {
	var out []string
	root := filepath.Join(d.home, "blobs")
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && p != filepath.Join(root, "kibotos-deployment") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// checkNoTemporaries checks that no temporary image or mount of a restore
// is left among the layers and volumes.
func (d *deployment) checkNoTemporaries() {
	for _, dir := range []string{filepath.Join(d.home, "layers"), filepath.Join(d.home, "volumes")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".mnt-") {
				d.t.Errorf("left by an interrupted restore: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}
