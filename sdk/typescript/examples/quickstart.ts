// quickstart creates a workspace, runs a command in it with its output
// streamed, writes and reads a file, and deletes the workspace. It reads
// the control plane's URL and an API token from KIBOTOS_URL and
// KIBOTOS_TOKEN. README.md shows it; test/quickstart.test.ts runs it.
import { Kibotos } from "@kibotos/sdk";

const kb = Kibotos.connect({ url: process.env.KIBOTOS_URL!, token: process.env.KIBOTOS_TOKEN! });
const ws = await kb.createWorkspace({ memoryBytes: 256 * 1024 * 1024 }); // waits for AVAILABLE
try {
  const { exitCode } = await ws.exec(["sh", "-c", "echo hello from $(hostname)"], {
    onStdout: (b) => process.stdout.write(b),
    onStderr: (b) => process.stderr.write(b),
  });
  console.log("exit code", exitCode);

  await ws.files.write("/root/main.py", "print(1)\n");
  console.log(await ws.files.readText("/root/main.py"));
} finally {
  await ws.delete();
  kb.close();
}
