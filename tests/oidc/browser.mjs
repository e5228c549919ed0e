// Drives Debian's Chromium through the portal like a researcher:
// node browser.mjs KUMO_URL INSTITUTION LOGIN TENANT LOCALE OUT_DIR
// Chooses the institution, logs in at the provider, lands on the
// dashboard, creates an 8-GPU VM, waits for it to run, and looks at its
// topology. Saves a screenshot of each page in OUT_DIR and prints a JSON
// summary of what it saw.
import { chromium } from 'playwright-core';

const [kumo, institution, login, tenant, locale, out] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ locale, viewport: { width: 1280, height: 900 } });
const seen = {};
try {
  await page.goto(`${kumo}/`);
  seen.chooser = page.url().includes('/login');
  await page.screenshot({ path: `${out}/login.png`, fullPage: true });
  await page.click(`text=${institution}`);
  // The provider's own pages: sign in, then consent.
  await page.fill('input[name="login"]', login);
  await page.fill('input[name="password"]', 'any');
  await page.click('button[type="submit"]');
  if (await page.$('button[type="submit"]')) {
    await page.click('button[type="submit"]');
  }
  await page.waitForURL(`${kumo}/**`);
  seen.dashboard_lang = await page.getAttribute('html', 'lang');
  seen.dashboard_has_tenant = (await page.$(`tr[data-tenant="${tenant}"]`)) !== null;
  await page.screenshot({ path: `${out}/dashboard.png`, fullPage: true });
  await page.click(`tr[data-tenant="${tenant}"] a`);
  await page.fill('input[name="name"]', 'browser-vm');
  await page.fill('input[name="gpus"]', '8');
  await page.click('form[action$="/vms"] button[type="submit"]');
  await page.waitForURL(`${kumo}/t/${tenant}/vms/browser-vm`);
  for (let i = 0; i < 40; i += 1) {
    const state = await page.getAttribute('strong.state', 'data-state');
    if (state === 'running') break;
    await page.waitForTimeout(250);
    await page.reload();
  }
  seen.vm_state = await page.getAttribute('strong.state', 'data-state');
  seen.gpu_boxes = (await page.$$('svg.topology g.gpu')).length;
  seen.nic_boxes = (await page.$$('svg.topology g.nic')).length;
  await page.screenshot({ path: `${out}/vm.png`, fullPage: true });
  await page.goto(`${kumo}/t/${tenant}/vms`);
  await page.screenshot({ path: `${out}/vms.png`, fullPage: true });
  await page.goto(`${kumo}/t/${tenant}/billing`);
  seen.billing_bars = (await page.$$('svg.chart rect.bar')).length;
  await page.screenshot({ path: `${out}/billing.png`, fullPage: true });
} catch (e) {
  seen.error = String(e);
  await page.screenshot({ path: `${out}/failure.png`, fullPage: true }).catch(() => {});
}
await browser.close();
console.log(JSON.stringify(seen));
