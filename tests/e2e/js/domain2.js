// The JavaScript SDK 2.x (npm `e2b` 2.51, unchanged), configured only with E2B_DOMAIN,
// E2B_API_KEY and NODE_EXTRA_CA_CERTS: run by tests/e2e/test_domain_js.py, prints what it
// saw as one JSON object (the Python side asserts). One sandbox, created to pause on timeout
// and auto-resume, does it all: commands, files, a guest HTTP server and a WebSocket echo
// server reached at getHost(port) (https:// and wss://), signed download/upload URLs as
// user and root, pause + connect with the server answering after, then pause + a plain
// HTTPS request that wakes it, and kill. CommonJS, so `node domain2.js WS_SERVER_FILE`
// runs it with NODE_PATH at .npm-e2b-ci.
const fs = require('fs')
const { Sandbox } = require('e2b')
const { WebSocket } = require('undici') // Node 20 has no global WebSocket

const WS_PORT = 8765
const SERVE =
  'mkdir -p /tmp/www && echo served to js 2.x > /tmp/www/index.html && ' +
  'cd /tmp/www && python3 -m http.server 8000 >/dev/null 2>&1 &'

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

async function answer(r) {
  const text = await r.text()
  try {
    return [r.status, JSON.parse(text)]
  } catch {
    return [r.status, text]
  }
}

// the guest's server starts in the background: fetched until it answers
async function served(url, waitMs = 30_000) {
  const deadline = Date.now() + waitMs
  for (;;) {
    try {
      const r = await fetch(url) // NODE_EXTRA_CA_CERTS: Node trusts the stack's CA
      const got = await answer(r)
      if (r.status === 200 || Date.now() > deadline) return got
    } catch (e) {
      if (Date.now() > deadline) return [0, String(e)]
    }
    await sleep(500)
  }
}

async function post(url, name, data) {
  const form = new FormData()
  form.append('file', new Blob([data]), name)
  return answer(await fetch(url, { method: 'POST', body: form }))
}

// one wss:// connection to the guest's echo server: what came back for a text message
// and for 40 KiB of bytes (several reads on both hops), then a clean close
function echo(url) {
  return new Promise((resolve) => {
    const got = { protocol: null, replies: [], closed: null }
    const ws = new WebSocket(url, ['chat.v1'])
    ws.binaryType = 'arraybuffer'
    const big = Buffer.alloc(40 * 1024, 7)
    const done = setTimeout(() => {
      got.error = 'timeout'
      ws.close()
      resolve(got)
    }, 30_000)
    ws.onopen = () => {
      got.protocol = ws.protocol
      ws.send('hello over wss')
    }
    ws.onmessage = (ev) => {
      if (typeof ev.data === 'string') {
        got.replies.push(ev.data)
        ws.send(big)
      } else {
        const data = Buffer.from(ev.data)
        got.replies.push([data.length, data.subarray(0, 5).toString()])
        got.bytesMatch = data.subarray(5).equals(big)
        ws.close(1000)
      }
    }
    ws.onerror = (ev) => {
      got.error = String(ev.error || ev.message || ev)
    }
    ws.onclose = (ev) => {
      got.closed = ev.code
      clearTimeout(done)
      resolve(got)
    }
  })
}

async function wsListening(sbx) {
  await sbx.commands.run(
    `for i in $(seq 100); do ss -ltn | grep -q :${WS_PORT} && break; sleep 0.1; done`
  )
}

async function state(id) {
  return (await Sandbox.getInfo(id)).state
}

async function main() {
  const sbx = await Sandbox.create({
    timeoutMs: 300_000,
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  const id = sbx.sandboxId
  const out = { id, host: sbx.getHost(8000), wsHost: sbx.getHost(WS_PORT) }
  try {
    out.echo = (await sbx.commands.run('echo hello from js 2.x')).stdout
    await sbx.files.write('/home/user/js2.txt', 'written by js 2.x')
    out.read = await sbx.files.read('/home/user/js2.txt')
    await sbx.files.write('/root/roots.txt', "root's", { user: 'root' })
    await sbx.commands.run(SERVE)
    const url = `https://${sbx.getHost(8000)}/index.html`
    out.served = await served(url)

    await sbx.files.write('/tmp/ws.py', fs.readFileSync(process.argv[2], 'utf8'))
    await sbx.commands.run('python3 /tmp/ws.py', { background: true })
    await wsListening(sbx)
    out.wss = await echo(`wss://${sbx.getHost(WS_PORT)}/chat`)

    out.signedUrl = await sbx.downloadUrl('js2.txt', { user: 'root', useSignatureExpiration: 120 })
    const down = {}
    const up = {}
    for (const user of [undefined, 'user', 'root']) {
      for (const exp of [undefined, 120]) {
        const opts = { user, useSignatureExpiration: exp }
        const path = user === 'root' ? 'roots.txt' : 'js2.txt'
        down[`${user}-${exp}`] = await answer(await fetch(await sbx.downloadUrl(path, opts)))
        const name = `up-${user}-${exp}.txt`
        up[name] = await post(await sbx.uploadUrl(name, opts), name, `sent as ${user}`)
      }
    }
    out.down = down
    out.up = up
    out.owners = (
      await sbx.commands.run("stat -c '%n %U' /home/user/up-*.txt /root/up-*.txt", {
        user: 'root',
      })
    ).stdout.split('\n')
    const late = await sbx.downloadUrl('js2.txt', { useSignatureExpiration: -120 })
    out.expired = await answer(await fetch(late))
    out.unsigned = (await fetch(late.split('&signature=')[0])).status

    // pause, then connect: the guest's servers answer again (no isRunning() while paused:
    // its envd request would itself wake an autoResume sandbox, as on E2B)
    out.paused = await sbx.betaPause()
    out.pausedState = await state(id)
    const back = await Sandbox.connect(id, { timeoutMs: 300_000 })
    out.resumedRunning = await back.isRunning()
    out.afterResume = await served(url)
    out.wssAfterResume = await echo(`wss://${back.getHost(WS_PORT)}/chat`)

    // pause again; a plain HTTPS request to the guest port wakes it (autoResume)
    await back.betaPause()
    out.pausedAgain = await state(id)
    out.woken = await answer(await fetch(url))
    out.wokenState = await state(id)
    out.envdAfterWake = (await back.commands.run('echo still here')).stdout
  } finally {
    await sbx.kill()
  }
  out.killedAgain = await Sandbox.kill(id) // false: it is gone
  out.listedAfter = (await Sandbox.list().nextItems()).some((s) => s.sandboxId === id)
  console.log(JSON.stringify(out))
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
