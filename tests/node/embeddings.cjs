// The official openai Node SDK's embeddings through the gateway, as an application calls them.
// The SDK asks for encoding_format "base64" unless told otherwise, and decodes the base64 itself
// into float32 numbers (a server that sends floats instead decodes to zeros, silently).
// Usage: GATEWAY_URL=http://127.0.0.1:PORT MODEL=tiny node embeddings.cjs  -> JSON on stdout.
const { OpenAI } = require("openai");

async function main() {
  const client = new OpenAI({ baseURL: `${process.env.GATEWAY_URL}/v1`, apiKey: "unused", maxRetries: 0 });
  const input = ["hello", "a second, longer input"];
  const model = process.env.MODEL;
  const byDefault = await client.embeddings.create({ model, input });
  const asFloats = await client.embeddings.create({ model, input, encoding_format: "float" });
  // What came over the wire for the SDK's default request: base64 strings. (The SDK tolerates a
  // server that sends floats anyway; older releases, 4.x, decoded those to zeros.)
  const wire = await (await client.embeddings.create({ model, input }).asResponse()).json();
  const vectors = (r) => r.data.map((d) => Array.from(d.embedding));
  process.stdout.write(
    JSON.stringify({
      base64: vectors(byDefault),
      float: vectors(asFloats),
      wire: wire.data.map((d) => typeof d.embedding),
    }),
  );
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
