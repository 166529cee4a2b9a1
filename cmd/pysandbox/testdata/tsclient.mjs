// A client on the official TypeScript MCP SDK, for tests that need a
// client nobody here wrote. Usage:
//   node tsclient.mjs SDK_DIR URL STEPS_JSON
// It connects over streamable HTTP (protocol PROTOCOL, default
// 2025-06-18; TOKEN, when set, as a bearer token), then runs the steps in
// order and prints one JSON line per step:
//   {"tool": NAME, "args": {...}}   → {"isError", "structured", "text"}
//   {"read": URI}                   → {"contents"} or {"error"}
//   {"readField": [I, FIELD]}       → as "read", of the URI in field FIELD
//                                     of step I's structured result
//   {"delete": true}                → ends the MCP session (HTTP DELETE)
// and finally {"mcpSession": ID}. An error ends it with exit code 1.
const [sdk, url, stepsJSON] = process.argv.slice(2);
const { Client } = await import(sdk + "/client/index.js");
const { StreamableHTTPClientTransport } = await import(sdk + "/client/streamableHttp.js");

const protocol = process.env.PROTOCOL || "2025-06-18";
const headers = process.env.TOKEN ? { Authorization: "Bearer " + process.env.TOKEN } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
// The SDK asks for its newest protocol; ask for the one under test (the
// server answers with the version it was asked for when it speaks it).
const send = transport.send.bind(transport);
transport.send = (msg, opts) => {
  if (msg.method === "initialize") msg.params.protocolVersion = protocol;
  return send(msg, opts);
};
const client = new Client({ name: "ts-test-client", version: "1.0.0" });
try {
  await client.connect(transport);
  if (client.getServerVersion() && transport.protocolVersion && transport.protocolVersion !== protocol) {
    throw new Error("negotiated " + transport.protocolVersion + ", not " + protocol);
  }
  const results = [];
  for (const step of JSON.parse(stepsJSON)) {
    if (step.tool) {
      const res = await client.callTool({ name: step.tool, arguments: step.args || {} });
      const text = (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
      results.push(res);
      console.log(JSON.stringify({ isError: !!res.isError, structured: res.structuredContent ?? null, text, size: JSON.stringify(res).length }));
    } else if (step.read || step.readField) {
      const [i, field] = step.readField || [];
      const uri = step.read || results[i]?.structuredContent?.[field];
      results.push(null);
      try {
        const res = await client.readResource({ uri });
        console.log(JSON.stringify({ contents: res.contents }));
      } catch (e) {
        console.log(JSON.stringify({ error: String(e.message || e) }));
      }
    } else if (step.delete) {
      results.push(null);
      await transport.terminateSession();
      console.log(JSON.stringify({ deleted: true }));
    }
  }
  console.log(JSON.stringify({ mcpSession: transport.sessionId ?? null, protocol: transport.protocolVersion ?? null }));
  await client.close();
} catch (e) {
  console.error(String(e && e.stack || e));
  process.exit(1);
}
