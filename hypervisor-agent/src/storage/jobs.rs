//! Long storage work off the agent's pass, bounded per tenant and per
//! host.
//!
//! A snapshot merged into its volume (qcow2's `rebase` copies the
//! snapshot's data), a volume made from a snapshot, a volume fetched from
//! another host: on a volume of a few GiB each takes seconds to minutes.
//! Done inside the pass, one tenant looping snapshot/delete held every
//! other VM's create, stop and console on the host (create → running
//! 5.6–6.6 s against 0.5 s at rest). So the pass only starts such work
//! ([`Jobs::start`]) and reads how it is going ([`Jobs::progress`]); the
//! work runs on its own, once it holds a slot ([`Slots`]): at most
//! [`Limits::per_tenant`] running for one tenant and [`Limits::per_host`]
//! in all, the rest waiting their turn (first come, first served among the
//! tenants under their limit). Meanwhile the pass leaves the volume out of
//! its report (the server keeps it in its transitional state); a job that
//! failed is that volume's failure, and is started again after [`RETRY`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

use super::StorageError;

/// How long a failed job's failure is reported before it is tried again.
pub const RETRY: Duration = Duration::from_secs(2);

/// How much long storage work runs at once on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Jobs of one tenant running at once.
    pub per_tenant: usize,
    /// Jobs running at once on the host, every tenant together.
    pub per_host: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_tenant: 1,
            per_host: 2,
        }
    }
}

impl Limits {
    /// At least one of each, so that work always goes on.
    fn sane(self) -> Limits {
        Limits {
            per_tenant: self.per_tenant.max(1),
            per_host: self.per_host.max(1),
        }
    }
}

/// Whose work it is: a tenant, or `None` for work the desired state did
/// not say the tenant of (an older server), which shares one allowance.
pub type Owner = Option<Uuid>;

/// The host's running slots for long storage work.
pub struct Slots {
    limits: Limits,
    inner: Mutex<SlotsInner>,
}

#[derive(Default)]
struct SlotsInner {
    running: usize,
    by_owner: HashMap<Owner, usize>,
    /// In arrival order.
    waiting: VecDeque<(Owner, oneshot::Sender<Permit>)>,
}

/// A running slot; given back when dropped.
pub struct Permit {
    slots: Arc<Slots>,
    owner: Owner,
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut g = self.slots.lock();
            g.running = g.running.saturating_sub(1);
            if let Some(n) = g.by_owner.get_mut(&self.owner) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    g.by_owner.remove(&self.owner);
                }
            }
        }
        self.slots.grant();
    }
}

impl Slots {
    pub fn new(limits: Limits) -> Arc<Slots> {
        Arc::new(Slots {
            limits: limits.sane(),
            inner: Mutex::default(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot for `owner`'s work.
    pub async fn acquire(self: &Arc<Self>, owner: Owner) -> Permit {
        loop {
            let (tx, rx) = oneshot::channel();
            self.lock().waiting.push_back((owner, tx));
            self.grant();
            // A sender is dropped unsent only when this receiver was
            // dropped first, which cannot be while it is awaited: but
            // never trust that with a panic.
            if let Ok(p) = rx.await {
                return p;
            }
        }
    }

    /// (running on the host, running for `owner`, waiting in all).
    pub fn counts(&self, owner: Owner) -> (usize, usize, usize) {
        let g = self.lock();
        (
            g.running,
            g.by_owner.get(&owner).copied().unwrap_or(0),
            g.waiting.len(),
        )
    }

    /// Hands slots to the first waiters whose owner is under its limit,
    /// while the host is under its own.
    fn grant(self: &Arc<Self>) {
        loop {
            let (owner, tx) = {
                let mut g = self.lock();
                // Waiters that gave up (a job called off) go.
                g.waiting.retain(|(_, tx)| !tx.is_closed());
                if g.running >= self.limits.per_host {
                    return;
                }
                let per_tenant = self.limits.per_tenant;
                let Some(i) = g
                    .waiting
                    .iter()
                    .position(|(o, _)| g.by_owner.get(o).copied().unwrap_or(0) < per_tenant)
                else {
                    return;
                };
                let Some((owner, tx)) = g.waiting.remove(i) else {
                    return;
                };
                g.running += 1;
                *g.by_owner.entry(owner).or_default() += 1;
                (owner, tx)
            };
            // Sent outside the lock: a waiter gone meanwhile drops the
            // permit, which gives the slot back (and grants again).
            let _ = tx.send(Permit {
                slots: self.clone(),
                owner,
            });
        }
    }
}

/// How a volume's long work is going, as the pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// None under way (none, or the last one succeeded, or failed long
    /// enough ago to be tried again): the pass does what is needed.
    Idle,
    /// Waiting for a slot or running: the pass leaves the volume alone.
    Busy,
    /// The last one failed, less than [`RETRY`] ago: the volume's error.
    Failed(String),
}

enum State {
    Waiting,
    Running,
    Finished(Result<(), String>, Instant),
}

struct Job {
    what: &'static str,
    state: State,
    generation: u64,
    /// Dropped with the job: a job still waiting for its slot stops.
    _cancel: oneshot::Sender<()>,
    /// Read by the pass since [`Jobs::begin_pass`].
    seen: bool,
}

/// The host's long storage work, one job per volume at a time.
pub struct Jobs {
    slots: Arc<Slots>,
    runtime: tokio::runtime::Handle,
    jobs: Arc<Mutex<BTreeMap<Uuid, Job>>>,
    generation: Mutex<u64>,
    finished: Arc<Notify>,
}

/// The work itself: blocking (it runs on a blocking thread).
pub type Work = Box<dyn FnOnce() -> Result<(), StorageError> + Send + 'static>;

impl Jobs {
    /// Jobs run on `runtime`, in `slots`.
    pub fn new(slots: Arc<Slots>, runtime: tokio::runtime::Handle) -> Arc<Jobs> {
        Arc::new(Jobs {
            slots,
            runtime,
            jobs: Arc::default(),
            generation: Mutex::new(0),
            finished: Arc::new(Notify::new()),
        })
    }

    pub fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Uuid, Job>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signalled whenever a job finishes: the agent then runs a pass, so
    /// that what it did is reported at once.
    pub fn finished(&self) -> Arc<Notify> {
        self.finished.clone()
    }

    /// Marks every job unread; see [`Jobs::end_pass`].
    pub fn begin_pass(&self) {
        for j in self.lock().values_mut() {
            j.seen = false;
        }
    }

    /// Jobs the pass did not read (their volume is no longer wanted) are
    /// forgotten: one still waiting for its slot is called off; one
    /// running finishes (it cannot be stopped halfway), unreported.
    pub fn end_pass(&self) {
        self.lock()
            .retain(|_, j| j.seen || matches!(j.state, State::Running));
    }

    /// How the volume's work is going (and marks it read).
    pub fn progress(&self, volume: Uuid) -> Progress {
        let mut jobs = self.lock();
        let Some(j) = jobs.get_mut(&volume) else {
            return Progress::Idle;
        };
        j.seen = true;
        match &j.state {
            State::Waiting | State::Running => Progress::Busy,
            State::Finished(Ok(()), _) => {
                jobs.remove(&volume);
                Progress::Idle
            }
            State::Finished(Err(why), at) => {
                if at.elapsed() < RETRY {
                    Progress::Failed(format!("{}: {why}", j.what))
                } else {
                    jobs.remove(&volume);
                    Progress::Idle
                }
            }
        }
    }

    /// Calls off the volume's job if it is still waiting for its slot;
    /// whether none is left running.
    pub fn call_off(&self, volume: Uuid) -> bool {
        let mut jobs = self.lock();
        match jobs.get(&volume).map(|j| &j.state) {
            Some(State::Running) => false,
            Some(_) => {
                jobs.remove(&volume);
                true
            }
            None => true,
        }
    }

    /// Whether the volume has a job waiting or running (tests, logs).
    pub fn busy(&self, volume: Uuid) -> bool {
        self.lock()
            .get(&volume)
            .is_some_and(|j| matches!(j.state, State::Waiting | State::Running))
    }

    /// Starts `work` on `volume` for `owner` (`what` names it in its
    /// failure). Refused (`false`) while the volume has a job under way.
    pub fn start(&self, volume: Uuid, owner: Owner, what: &'static str, work: Work) -> bool {
        let generation = {
            let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
            *g += 1;
            *g
        };
        let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
        {
            let mut jobs = self.lock();
            if jobs
                .get(&volume)
                .is_some_and(|j| matches!(j.state, State::Waiting | State::Running))
            {
                return false;
            }
            jobs.insert(
                volume,
                Job {
                    what,
                    state: State::Waiting,
                    generation,
                    _cancel: cancel_tx,
                    seen: true,
                },
            );
        }
        let (slots, jobs, finished) =
            (self.slots.clone(), self.jobs.clone(), self.finished.clone());
        let set = move |state: State| {
            let mut jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            match jobs.get_mut(&volume) {
                Some(j) if j.generation == generation => {
                    j.state = state;
                    true
                }
                _ => false,
            }
        };
        self.runtime.spawn(async move {
            let permit = tokio::select! {
                p = slots.acquire(owner) => p,
                // The job was forgotten before its turn came.
                _ = cancel_rx => return,
            };
            if !set(State::Running) {
                return;
            }
            tracing::info!(volume = %volume, what, "storage job started");
            let started = Instant::now();
            let outcome = match tokio::task::spawn_blocking(|| super::in_background(work)).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(e) => Err(format!("the job stopped: {e}")),
            };
            drop(permit);
            match &outcome {
                Ok(()) => {
                    tracing::info!(volume = %volume, what, took = ?started.elapsed(), "storage job done")
                }
                Err(e) => {
                    tracing::warn!(volume = %volume, what, error = %e, "storage job failed")
                }
            }
            set(State::Finished(outcome, Instant::now()));
            finished.notify_one();
        });
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A job that records how many run at once (overall and for its
    /// tenant) and holds its slot until `release` says so.
    fn job(
        running: Arc<AtomicUsize>,
        peak: Arc<AtomicUsize>,
        release: Arc<std::sync::Barrier>,
    ) -> Work {
        Box::new(move || {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            release.wait();
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
    }

    /// On a failing assertion, lets every job waiting at a gate go: the
    /// test's runtime waits for its blocking threads when it is dropped,
    /// so a job left at its barrier turned a failure into a hang (CI saw
    /// 23 minutes).
    struct Unstick(Vec<Arc<std::sync::Barrier>>);

    impl Drop for Unstick {
        fn drop(&mut self) {
            if std::thread::panicking() {
                for g in &self.0 {
                    let g = g.clone();
                    std::thread::spawn(move || {
                        g.wait();
                    });
                }
            }
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One tenant with three jobs, another with one, per-tenant 1 and
    /// per-host 2: the first tenant never runs two at once, the second's
    /// job runs beside it rather than after the first tenant's queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_are_bounded_per_tenant_and_per_host_and_take_turns() {
        let slots = Slots::new(Limits::default());
        let jobs = Jobs::new(slots.clone(), tokio::runtime::Handle::current());
        let (a, b) = (Some(Uuid::new_v4()), Some(Uuid::new_v4()));
        let running_a = Arc::new(AtomicUsize::new(0));
        let peak_a = Arc::new(AtomicUsize::new(0));
        let running_b = Arc::new(AtomicUsize::new(0));
        let peak_b = Arc::new(AtomicUsize::new(0));
        // Each job waits at its own barrier with the test.
        let gates: Vec<Arc<std::sync::Barrier>> = (0..4)
            .map(|_| Arc::new(std::sync::Barrier::new(2)))
            .collect();
        let _unstick = Unstick(gates.clone());
        let vols: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        // Which of A's jobs got a slot, in order: their tasks ask for slots
        // in whatever order the runtime runs them, not the order they were
        // started in (releasing gate 0 first deadlocked when job 1 held
        // A's slot).
        let started = Arc::new(Mutex::new(Vec::new()));
        for (i, v) in vols.iter().take(3).enumerate() {
            let w = job(running_a.clone(), peak_a.clone(), gates[i].clone());
            let s = started.clone();
            let w: Work = Box::new(move || {
                s.lock().unwrap().push(i);
                w()
            });
            assert!(jobs.start(*v, a, "test work", w));
        }
        let w = job(running_b.clone(), peak_b.clone(), gates[3].clone());
        assert!(jobs.start(vols[3], b, "test work", w));
        assert!(
            !jobs.start(vols[3], b, "test work", Box::new(|| Ok(()))),
            "one job per volume"
        );
        // A's first and B's run; A's others wait. (B holds its slot a
        // moment before its work counts itself running: asserting that at
        // once failed now and then.)
        until("two running", || slots.counts(a) == (2, 1, 2)).await;
        until("B running beside A's first: not queued behind A", || {
            running_b.load(Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(jobs.progress(vols[1]), Progress::Busy);
        // Let them go one by one, B's first, then A's in the order they
        // got their slot; A never runs two at once.
        let release = async |g: &Arc<std::sync::Barrier>| {
            let g = g.clone();
            tokio::task::spawn_blocking(move || {
                g.wait();
            })
            .await
            .unwrap();
        };
        release(&gates[3]).await;
        for k in 0..3 {
            until("A's next job running", || started.lock().unwrap().len() > k).await;
            let i = started.lock().unwrap()[k];
            release(&gates[i]).await;
        }
        until("all done", || vols.iter().all(|v| !jobs.busy(*v))).await;
        assert_eq!(peak_a.load(Ordering::SeqCst), 1, "one of A's at a time");
        assert_eq!(slots.counts(a), (0, 0, 0));
        for v in &vols {
            assert_eq!(jobs.progress(*v), Progress::Idle);
        }
    }

    /// A failure is the volume's for [`RETRY`], then it may be tried
    /// again; a job forgotten while waiting never runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failure_is_reported_then_retried_and_a_forgotten_job_never_runs() {
        let slots = Slots::new(Limits {
            per_tenant: 1,
            per_host: 1,
        });
        let jobs = Jobs::new(slots.clone(), tokio::runtime::Handle::current());
        let (v, w) = (Uuid::new_v4(), Uuid::new_v4());
        let gate = Arc::new(std::sync::Barrier::new(2));
        let _unstick = Unstick(vec![gate.clone()]);
        let g = gate.clone();
        assert!(jobs.start(
            v,
            None,
            "merging snapshots",
            Box::new(move || {
                g.wait();
                Err(StorageError::Refused("no room".into()))
            })
        ));
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        assert!(jobs.start(
            w,
            None,
            "test work",
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        ));
        until("v running", || slots.counts(None) == (1, 1, 1)).await;
        // The pass no longer asks for w: it is called off.
        jobs.begin_pass();
        assert_eq!(jobs.progress(v), Progress::Busy);
        jobs.end_pass();
        assert!(!jobs.busy(w));
        let g = gate.clone();
        tokio::task::spawn_blocking(move || g.wait()).await.unwrap();
        until("v failed", || !jobs.busy(v)).await;
        assert_eq!(
            jobs.progress(v),
            Progress::Failed("merging snapshots: no room".into())
        );
        tokio::time::sleep(RETRY).await;
        assert_eq!(jobs.progress(v), Progress::Idle, "tried again after RETRY");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the forgotten job never ran");
        assert_eq!(slots.counts(None), (0, 0, 0));
    }
}
