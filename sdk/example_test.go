package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/sdk"
)

// Create a Workspace, run a command in it, and move a file in and out.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	c := sdk.New("http://127.0.0.1:8870", os.Getenv("KIBOTOS_TOKEN"))
	defer c.Close()

	ws, err := c.CreateWorkspace(ctx, sdk.CreateOptions{Template: "base", MemoryBytes: 1 << 30})
	if err != nil {
		if d, ok := sdk.FailureOf(err); ok {
			log.Fatalf("create: %v (code %s, reason %s)", err, connect.CodeOf(err), d.GetReason())
		}
		log.Fatal(err)
	}
	defer c.DeleteWorkspace(context.WithoutCancel(ctx), ws.ID())

	status, err := ws.Exec(ctx, []string{"echo", "hello"}, sdk.ExecOptions{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("echo:", status)

	if _, err := ws.Upload(ctx, strings.NewReader("some data\n"), "/tmp/data.txt", 0o644); err != nil {
		log.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := ws.Download(ctx, "/tmp/data.txt", &back); err != nil {
		log.Fatal(err)
	}
	fmt.Print(back.String())
}
