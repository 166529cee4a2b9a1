// A client on the official TypeScript MCP SDK for tests of what one
// message can do to a server, over stdio or streamable HTTP. Usage:
//   node tsstdio.mjs SDK_DIR STEPS_JSON URL
//   node tsstdio.mjs SDK_DIR STEPS_JSON COMMAND [ARG...]
// connects to URL, or starts COMMAND ARG... and speaks MCP on its stdio,
// then runs the steps in order and prints one JSON line per step:
//   {"tool": NAME, "args": {...}, "fill": {"arg": KEY, "bytes": N, "base64": B},
//    "timeout": MS, "reset": B}
//     → {"isError", "structured", "text", "progress"} or {"error", "code"}
// "fill" sets args[KEY] to N bytes made here (a line far too long for
// argv): "x"s, or N bytes in base64. A string argument "$session" is the
// session_id of the last create_session. "timeout" is the request timeout
// (the SDK's default is 60 s); "reset" makes progress notifications reset
// it (resetTimeoutOnProgress). "progress" counts those the call got.
// An error outside a step ends it with exit code 1.
const [sdk, stepsJSON, target, ...args] = process.argv.slice(2);
const { Client } = await import(sdk + "/client/index.js");

let transport;
if (/^https?:/.test(target)) {
  const { StreamableHTTPClientTransport } = await import(sdk + "/client/streamableHttp.js");
  transport = new StreamableHTTPClientTransport(new URL(target));
} else {
  const { StdioClientTransport } = await import(sdk + "/client/stdio.js");
  transport = new StdioClientTransport({ command: target, args, stderr: "inherit" });
}
const client = new Client({ name: "ts-stdio-test-client", version: "1.0.0" });
try {
  await client.connect(transport);
  let session = null;
  for (const step of JSON.parse(stepsJSON)) {
    const callArgs = {};
    for (const [k, v] of Object.entries(step.args || {})) {
      callArgs[k] = v === "$session" ? session : v;
    }
    if (step.fill) {
      const buf = Buffer.alloc(step.fill.bytes, "x");
      callArgs[step.fill.arg] = step.fill.base64 ? buf.toString("base64") : buf.toString("latin1");
    }
    let progress = 0;
    const options = { onprogress: () => { progress++; } };
    if (step.timeout) options.timeout = step.timeout;
    if (step.reset) options.resetTimeoutOnProgress = true;
    try {
      const res = await client.callTool({ name: step.tool, arguments: callArgs }, undefined, options);
      if (step.tool === "create_session" && res.structuredContent) session = res.structuredContent.session_id;
      const text = (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
      console.log(JSON.stringify({ isError: !!res.isError, structured: res.structuredContent ?? null, text, progress }));
    } catch (e) {
      console.log(JSON.stringify({ error: String(e && e.message || e), code: e && e.code || 0, progress }));
    }
  }
  await client.close();
} catch (e) {
  console.error(String(e && e.stack || e));
  process.exit(1);
}
