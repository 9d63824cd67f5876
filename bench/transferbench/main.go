// Command transferbench measures transfers on a running `kibotos up`
// through the Go SDK: export, import and restore throughput of a
// workspace whose Volume holds -volume-mib of random data, and the
// artifact size of a -layer-mib writable layer holding -data-mib of
// random data. Run the deployment with a volume size above -volume-mib.
//
//	kibotos up --home /tmp/tb --listen 127.0.0.1:18872 --volume-size 2Gi &
//	go run ./bench/transferbench -addr 127.0.0.1:18872 -home /tmp/tb
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	volumeMiB := flag.Int("volume-mib", 1024, "random data written to the Volume, in MiB")
	layerMiB := flag.Int("layer-mib", 2048, "writable layer capacity of the second workspace, in MiB")
	dataMiB := flag.Int("data-mib", 100, "random data written to that layer, in MiB")
	benchutil.Main("transferbench", func() error { return run(*addr, *home, *volumeMiB, *layerMiB, *dataMiB) })
}

func run(addr, home string, volumeMiB, layerMiB, dataMiB int) error {
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	ctx := context.Background()
	client := sdk.New("http://"+addr, token)
	defer client.Close()
	wss := ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(token)))
	tmp, err := os.MkdirTemp("", "transferbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// Export, import and restore of a Volume holding volumeMiB of data.
	ws, err := create(ctx, client, wss, &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 << 20, WritableLayerBytes: 256 << 20},
		Volume:    &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW},
	})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws.ID())
	if err := fill(ctx, ws, "/data/random", volumeMiB); err != nil {
		return err
	}
	art := filepath.Join(tmp, "volume.kbt")
	exported, exportTime, err := export(ctx, client, ws, art)
	if err != nil {
		return err
	}
	f, err := os.Open(art)
	if err != nil {
		return err
	}
	start := time.Now()
	imported, err := client.ImportTransfer(ctx, f)
	f.Close()
	if err != nil {
		return err
	}
	importTime := time.Since(start)
	start = time.Now()
	restored, err := client.Restore(ctx, imported.GetTransferId())
	if err != nil {
		return err
	}
	restoreTime := time.Since(start)
	defer client.DeleteWorkspace(ctx, restored.ID())
	mib := float64(volumeMiB)
	fmt.Printf("volume with %d MiB of random data: artifact %.1f MiB\n", volumeMiB, float64(exported.GetManifest().GetSizeBytes())/(1<<20))
	fmt.Printf("export (stopped workspace to COMPLETE, download included): %.1f s, %.0f MiB/s\n", exportTime.Seconds(), mib/exportTime.Seconds())
	fmt.Printf("import (upload, verification, commit): %.1f s, %.0f MiB/s\n", importTime.Seconds(), mib/importTime.Seconds())
	fmt.Printf("restore (RestoreWorkspace to AVAILABLE): %.1f s, %.0f MiB/s\n", restoreTime.Seconds(), mib/restoreTime.Seconds())
	for _, id := range []string{exported.GetTransferId(), imported.GetTransferId()} {
		deleteTransfer(ctx, token, addr, id)
	}

	// The artifact of a large, mostly empty layer.
	ws2, err := create(ctx, client, wss, &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 256 << 20, WritableLayerBytes: uint64(layerMiB) << 20},
	})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws2.ID())
	if err := fill(ctx, ws2, "/root/random", dataMiB); err != nil {
		return err
	}
	layer, layerTime, err := export(ctx, client, ws2, filepath.Join(tmp, "layer.kbt"))
	if err != nil {
		return err
	}
	fmt.Printf("%d MiB layer holding %d MiB of random data: artifact %.1f MiB, export %.1f s\n", layerMiB, dataMiB,
		float64(layer.GetManifest().GetSizeBytes())/(1<<20), layerTime.Seconds())
	deleteTransfer(ctx, token, addr, layer.GetTransferId())
	return nil
}

// create creates a workspace and waits until it is AVAILABLE.
func create(ctx context.Context, client *sdk.Client, wss ctrlv1connect.WorkspaceServiceClient, spec *ctrlv1.WorkspaceCreateSpec) (*sdk.Workspace, error) {
	resp, err := wss.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, Spec: spec}))
	if err != nil {
		return nil, err
	}
	for {
		ws, err := client.Workspace(ctx, resp.Msg.GetWorkspace().GetWorkspaceId())
		if err != nil {
			return nil, err
		}
		switch ws.Info().GetState() {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
			return ws, nil
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
			return nil, fmt.Errorf("workspace %s failed: %v", ws.ID(), ws.Info().GetFailure())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fill writes mib MiB of random data to path in the guest.
func fill(ctx context.Context, ws *sdk.Workspace, path string, mib int) error {
	var stderr bytes.Buffer
	st, err := ws.Exec(ctx, []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > %s && sync", mib<<20, path)},
		sdk.ExecOptions{Stderr: &stderr})
	if err != nil || !st.Success() {
		return fmt.Errorf("writing %s: %v %v %s", path, st, err, stderr.String())
	}
	return nil
}

// export stops a workspace and times its export into file.
func export(ctx context.Context, client *sdk.Client, ws *sdk.Workspace, file string) (*ctrlv1.Transfer, time.Duration, error) {
	if _, err := client.StopWorkspace(ctx, ws.ID(), sdk.StopOptions{}); err != nil {
		return nil, 0, err
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	start := time.Now()
	t, err := ws.Export(ctx, f)
	return t, time.Since(start), err
}

func deleteTransfer(ctx context.Context, token, addr, id string) {
	c := ctrlv1connect.NewTransferServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(token)))
	c.DeleteTransfer(ctx, connect.NewRequest(&ctrlv1.DeleteTransferRequest{Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, TransferId: id}))
}
