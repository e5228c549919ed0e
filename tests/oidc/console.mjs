// Drives Debian's Chromium to a VM's console page like a researcher:
// node console.mjs KUMO_URL TOKEN TENANT VM LOCALE OUT_DIR
// Signs in with an API token, opens the console page, types a command
// into xterm.js and reads its output, then sends a long line through the
// send-text box and reads what the shell made of it. Saves screenshots in
// OUT_DIR and prints a JSON summary of what it saw.
import { chromium } from 'playwright-core';

const [kumo, token, tenant, vm, locale, out] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ locale, viewport: { width: 1280, height: 900 } });
const seen = { console_errors: [], bad_responses: [] };
// Script errors, and responses that failed (but the favicon, which the
// portal does not have).
page.on('console', (m) => {
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) seen.console_errors.push(m.text());
});
page.on('response', (r) => {
  if (r.status() >= 400 && !r.url().endsWith('/favicon.ico')) seen.bad_responses.push(`${r.status()} ${r.url()}`);
});
const screen = () => page.$eval('.xterm-rows', (r) => r.textContent).catch(() => '');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Polls from here (the page's CSP refuses the eval that waitForFunction's
// in-page polling needs) until `probe` answers true; false after `ms`.
async function poll(probe, ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await probe()) return true;
    await sleep(200);
  }
  return false;
}
// Waits until the terminal shows `text`, doing `retry` first and again
// every few seconds (the shell may still be starting).
async function until(text, retry, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (retry) await retry();
    if (await poll(async () => (await screen()).includes(text), 4000)) return true;
    if (Date.now() > deadline) return false;
  }
}
try {
  const here = `/t/${tenant}/vms/${vm}/console`;
  await page.goto(`${kumo}/login?next=${encodeURIComponent(here)}`);
  // Open already when no institution is configured.
  if (!(await page.$('details.token-login[open]'))) await page.click('details.token-login summary');
  await page.fill('input[name="token"]', token);
  await page.click('details.token-login button[type="submit"]');
  await page.waitForURL(`${kumo}${here}`);
  seen.lang = await page.getAttribute('html', 'lang');
  await page.waitForSelector('.xterm-rows', { timeout: 20000 });
  const connecting = await page.getAttribute('#console', 'data-l-connecting');
  seen.connected = await poll(async () => (await page.textContent('#console-status')) !== connecting, 30000);
  seen.status = await page.textContent('#console-status');
  // Keys typed on the page's terminal reach the guest's shell.
  seen.typed = await until('web-42', async () => {
    await page.click('#terminal');
    await page.keyboard.type('echo web-$((6*7))');
    await page.keyboard.press('Enter');
  });
  await page.screenshot({ path: `${out}/console.png`, fullPage: true });
  // A long line (a password, a command) through the send-text box.
  const long = 'k'.repeat(1000);
  await page.fill('#paste', `L=${long}; echo len-\${#L}`);
  await page.click('#send-text button[type="submit"]');
  seen.pasted = await until('len-1000', null, 30000);
  seen.screen_tail = (await screen()).slice(-300);
  await page.screenshot({ path: `${out}/console-pasted.png`, fullPage: true });
} catch (e) {
  seen.error = String(e);
  seen.screen_tail = (await screen()).slice(-600);
  await page.screenshot({ path: `${out}/console-failure.png`, fullPage: true }).catch(() => {});
}
await browser.close();
console.log(JSON.stringify(seen));
