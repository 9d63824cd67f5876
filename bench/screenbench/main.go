// Command screenbench measures computer use through the Go SDK against a
// running `kibotos up` that has the built-in template desktop: the round
// trip of CaptureScreen (a 1280x800 PNG) and of DeliverInput (a pointer
// move; a click and 16 typed characters), p50 and p99, on a desktop
// showing two terminals full of text.
//
//	go run ./bench/screenbench -addr 127.0.0.1:8870 -home /var/lib/kibotos
package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/sdk"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	n := flag.Int("n", 100, "calls of each kind to time")
	benchutil.Main("screenbench", func() error { return run(*addr, *home, *n) })
}

func run(addr, home string, n int) error {
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	client := sdk.New("http://"+addr, token)
	defer client.Close()
	ctx := context.Background()

	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{Template: "desktop", MemoryBytes: 1 << 30,
		Capabilities: []string{"screen", "input"}})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws.ID())
	// Something to draw: two terminals full of text.
	for i, geometry := range []string{"100x40+0+0", "100x40+620+200"} {
		if _, err := ws.Start(ctx, []string{"xterm", "-geometry", geometry, "-e", "sh", "-c", "ls -lR /usr/share | head -200; exec sleep 100000"},
			sdk.ExecOptions{Tag: fmt.Sprintf("terminal-%d", i)}); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second) // let them draw

	shot, err := ws.Screenshot(ctx) // issues the session
	if err != nil {
		return err
	}
	var capture []time.Duration
	size := 0
	for range n {
		start := time.Now()
		shot, err = ws.Screenshot(ctx)
		if err != nil {
			return err
		}
		capture = append(capture, time.Since(start))
		size += len(shot.GetPng())
	}
	benchutil.Report(fmt.Sprintf("CaptureScreen %dx%d", shot.GetWidth(), shot.GetHeight()), capture)
	fmt.Printf("%-28s %d KiB on average\n", "PNG size", size/n/1024)

	var move []time.Duration
	for i := range n {
		start := time.Now()
		if err := ws.Input(ctx, sdk.MoveTo(uint32(i*7%1280), uint32(i*5%800))); err != nil {
			return err
		}
		move = append(move, time.Since(start))
	}
	benchutil.Report("DeliverInput pointer move", move)

	var typing []time.Duration
	for range n {
		start := time.Now()
		if err := ws.Input(ctx, sdk.MoveTo(300, 300), sdk.Button(1), sdk.Type("echo hello world")); err != nil {
			return err
		}
		typing = append(typing, time.Since(start))
	}
	benchutil.Report("DeliverInput click+16 chars", typing)
	return nil
}
