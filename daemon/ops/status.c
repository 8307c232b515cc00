/* The status snapshot and its columns (status.h); the reply and line views. */
#include "status.h"
#include "catalog.h"
#include "cudadev.h"
#include "mancache.h"
#include "pool.h"
#include "rangecache.h"
#include "readshare.h"
#include "save.h"
#include "wire.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define REPLY SV_REPLY
#define METRIC SV_METRIC
#define LINE SV_LINE

/* In the order of the Prometheus text; a family's columns are adjacent. */
const struct status_col status_cols[ST_NCOLS] = {
	[ST_BYTES_STAGED] = { "bytes_staged", "Bytes copied into the staging pool.", ST_COUNTER, ST_UNIT_BYTES,
			      REPLY | METRIC, "ckptd_bytes_staged_total" },
	[ST_BYTES_DURABLE] = { "bytes_durable", "Bytes made durable in storage.", ST_COUNTER, ST_UNIT_BYTES,
			       REPLY | METRIC, "ckptd_bytes_uploaded_total", .backend = true },
	[ST_BYTES_STORED] = { "bytes_stored", "Bytes of shard objects written: bytes made durable, after compression.",
			      ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_bytes_stored_total", .backend = true },
	[ST_BYTES_RESTORED_MEMORY] = { "bytes_restored_memory", "Bytes restored into trainer buffers.", ST_COUNTER,
				       ST_UNIT_BYTES, REPLY | METRIC, "ckptd_bytes_restored_total",
				       "source=\"memory\"" },
	[ST_BYTES_RESTORED_STORAGE] = { "bytes_restored_storage", "Bytes restored from storage.", ST_COUNTER,
					ST_UNIT_BYTES, METRIC, "ckptd_bytes_restored_total", "source=\"storage\"" },
	[ST_BYTES_RESTORED] = { "bytes_restored", "Bytes restored, from memory and storage.", ST_COUNTER, ST_UNIT_BYTES,
				REPLY | METRIC, "ckptd_bytes_restored_total", .sum = true },
	[ST_RESTORES_FROM_MEMORY] = { "restores_from_memory", "Loads served, by where all their bytes came from.",
				      ST_COUNTER, ST_UNIT_COUNT, REPLY | METRIC, "ckptd_restores_total",
				      "source=\"memory\"" },
	[ST_RESTORES_FROM_STORAGE] = { "restores_from_storage", "Loads not served wholly from memory.", ST_COUNTER,
				       ST_UNIT_COUNT, REPLY | METRIC, "ckptd_restores_total", "source=\"storage\"" },
	[ST_SAVE_STALL] = { "save_stall", "Time from a save request to staged (the trainer's stall).", ST_HISTOGRAM,
			    ST_UNIT_SECONDS, METRIC, "ckptd_save_stall_seconds",
			    .hist = offsetof(struct status, save_stall) },
	[ST_SAVE_DURABLE] = { "save_durable", "Time from a save request to durable.", ST_HISTOGRAM, ST_UNIT_SECONDS,
			      METRIC, "ckptd_save_durable_seconds", .hist = offsetof(struct status, save_durable) },
	[ST_POOL_BYTES] = { "pool_bytes", "Size of the staging pool.", ST_GAUGE, ST_UNIT_BYTES, REPLY | METRIC | LINE,
			    "ckptd_pool_bytes" },
	[ST_POOL_USED_BYTES] = { "pool_used_bytes", "Pool bytes in use, memory tier included.", ST_GAUGE, ST_UNIT_BYTES,
				 REPLY | METRIC | LINE, "ckptd_pool_used_bytes" },
	[ST_POOL_HELD_BYTES] = { "pool_held_bytes", "Pool bytes held as the memory tier.", ST_GAUGE, ST_UNIT_BYTES,
				 REPLY | METRIC, "ckptd_pool_held_bytes" },
	[ST_POOL_MEMORY_ONLY_BYTES] = { "pool_memory_only_bytes",
					"Pool bytes of copies held in memory only (tier memory or replicated, "
					"not persisted): never dropped for space.",
					ST_GAUGE, ST_UNIT_BYTES, METRIC, "ckptd_pool_memory_only_bytes" },
	[ST_INFLIGHT_SAVES] = { "inflight_saves", "Saves admitted and not yet durable or failed.", ST_GAUGE,
				ST_UNIT_COUNT, REPLY | METRIC | LINE, "ckptd_saves_inflight" },
	[ST_WAITING_SAVES] = { "waiting_saves", "Saves waiting for pool space.", ST_GAUGE, ST_UNIT_COUNT,
			       REPLY | METRIC | LINE, "ckptd_saves_waiting" },
	[ST_SAVES_TOTAL] = { "saves_total", "Save requests received.", ST_COUNTER, ST_UNIT_COUNT, REPLY | METRIC,
			     "ckptd_saves_total" },
	[ST_SAVES_SUPERSEDED] = { "saves_superseded", "Saves that failed, by reason.", ST_COUNTER, ST_UNIT_COUNT,
				  REPLY | METRIC, "ckptd_saves_failed_total", "reason=\"superseded\"" },
	[ST_SAVES_SKIPPED] = { "saves_skipped", "Saves skipped by the skip policy.", ST_COUNTER, ST_UNIT_COUNT,
			       REPLY | METRIC, "ckptd_saves_failed_total", "reason=\"skipped\"" },
	[ST_SAVES_FAILED_OTHER] = { "saves_failed_other", "Saves that failed for another reason.", ST_COUNTER,
				    ST_UNIT_COUNT, METRIC, "ckptd_saves_failed_total", "reason=\"other\"" },
	[ST_SAVES_FAILED] = { "saves_failed", "Saves that failed, every reason.", ST_COUNTER, ST_UNIT_COUNT,
			      REPLY | METRIC, "ckptd_saves_failed_total", .sum = true },
	[ST_STORE_DIRECT_BYTES] = { "store_direct_bytes",
				    "Bytes written to file:// storage with O_DIRECT (bypassing the page cache).",
				    ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_store_direct_bytes_total",
				    .backend = true },
	[ST_STORE_RETRIES] = { "store_retries", "Storage requests retried.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
			       "ckptd_store_retries_total", .backend = true },
	[ST_STORE_FAILURES] = { "store_failures", "Uploads that failed in storage.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				"ckptd_store_failures_total", .backend = true },
	[ST_STORE_READ_BYTES] = { "store_read_bytes",
				  "Shard bytes restores read from storage, a read the node's concurrent loads shared "
				  "counted once.",
				  ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_store_read_bytes_total" },
	[ST_STORE_READS_SHARED] = { "store_reads_shared",
				    "Restores' storage reads served by another load's read of the same range.",
				    ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_store_reads_shared_total" },
	[ST_STORE_READ_SHARED_BYTES] = { "store_read_shared_bytes",
					 "Bytes of restores' storage reads served by another load's read.", ST_COUNTER,
					 ST_UNIT_BYTES, METRIC, "ckptd_store_read_shared_bytes_total" },
	[ST_RANGE_BYTES_IN] = { "range_bytes_in",
				"Bytes restores got from the peer that read them from storage for the job's nodes.",
				ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_range_bytes_in_total" },
	[ST_RANGE_BYTES_OUT] = { "range_bytes_out",
				 "Bytes this node read from storage and sent to the peers that restore them too.",
				 ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_range_bytes_out_total" },
	[ST_RANGE_FALLBACKS] = { "range_fallbacks",
				 "Reads shared across nodes the peers did not give (gone, slow, no longer kept), or "
				 "whose bytes failed the check, read from storage instead.",
				 ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_range_fallbacks_total" },
	[ST_RANGE_KEPT_BYTES] = { "range_kept_bytes", "Bytes of ranges kept here for the peers ([peers] read_cache).",
				  ST_GAUGE, ST_UNIT_BYTES, METRIC, "ckptd_range_kept_bytes" },
	[ST_MANIFEST_READS] = { "manifest_reads", "Manifests read from storage (GETs), by any path.", ST_COUNTER,
				ST_UNIT_COUNT, METRIC, "ckptd_manifest_reads_total", .backend = true },
	[ST_STEP_INDEX_READS] = { "step_index_reads",
				  "Step indexes read from storage (GETs), for show of a whole step.", ST_COUNTER,
				  ST_UNIT_COUNT, METRIC, "ckptd_step_index_reads_total", .backend = true },
	[ST_STEP_INDEX_WRITES] = { "step_index_writes", "Step indexes this daemon tried to create (PUTs).", ST_COUNTER,
				   ST_UNIT_COUNT, METRIC, "ckptd_step_index_writes_total", .backend = true },
	[ST_WAIT_POLLS] = { "wait_polls", "Listings of a step made for the waiters of it (one per poll, shared).",
			    ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_wait_polls_total" },
	[ST_MANIFEST_CACHE_HITS] = { "manifest_cache_hits",
				     "Manifest reads of pinned steps served by the cache (kept, or shared with a read "
				     "in flight).",
				     ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_manifest_cache_hits_total" },
	[ST_MANIFEST_CACHE_MISSES] = { "manifest_cache_misses", "Manifest reads of pinned steps the cache fetched.",
				       ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_manifest_cache_misses_total" },
	[ST_MANIFEST_CACHE_BYTES] = { "manifest_cache_bytes", "Decoded manifests kept by the cache (estimated bytes).",
				      ST_GAUGE, ST_UNIT_BYTES, METRIC, "ckptd_manifest_cache_bytes" },
	[ST_MANIFEST_CACHE_ENTRIES] = { "manifest_cache_entries", "Manifests in the cache, fetches in flight included.",
					ST_GAUGE, ST_UNIT_COUNT, METRIC, "ckptd_manifest_cache_entries" },
	[ST_SESSIONS] = { "sessions", "Connected clients.", ST_GAUGE, ST_UNIT_COUNT, REPLY | METRIC | LINE,
			  "ckptd_sessions" },
	[ST_RECOVERED_FILES] = { "recovered_files", "Files a crashed run left, removed at start.", ST_GAUGE,
				 ST_UNIT_COUNT, REPLY | METRIC, "ckptd_recovered_files" },
	[ST_UPTIME_NS] = { "uptime_ns", "Seconds since start.", ST_GAUGE, ST_UNIT_NS, REPLY | METRIC,
			   "ckptd_uptime_seconds" },
	[ST_CHUNK_BYTES] = { "chunk_bytes", "Size of one staging pool chunk.", ST_GAUGE, ST_UNIT_BYTES, REPLY | METRIC,
			     "ckptd_chunk_bytes" },
	[ST_RECLAIMED_BYTES] = { "reclaimed_bytes", "Memory-tier bytes dropped to make room for saves.", ST_COUNTER,
				 ST_UNIT_BYTES, REPLY | METRIC, "ckptd_reclaimed_bytes_total" },
	[ST_CPU_NS] = { "cpu_ns", "User and system CPU time of ckptd.", ST_COUNTER, ST_UNIT_NS, REPLY | METRIC,
			"ckptd_cpu_seconds_total" },
	[ST_PEAK_RSS_BYTES] = { "peak_rss_bytes", "Peak resident set of ckptd.", ST_GAUGE, ST_UNIT_BYTES,
				REPLY | METRIC, "ckptd_peak_rss_bytes" },
	[ST_HELD_COPIES] = { "held_copies", "Checkpoint copies held as the memory tier.", ST_GAUGE, ST_UNIT_COUNT,
			     METRIC | LINE, "ckptd_held_copies" },
	[ST_PEER_BYTES_SENT] = { "peer_bytes_sent", "Bytes of replicas sent to peers, and of copies handed back.",
				 ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_peer_replicated_bytes_total" },
	[ST_PEER_BYTES_RECEIVED] = { "peer_bytes_received",
				     "Bytes of replicas received from peers, and of copies "
				     "brought back from them.",
				     ST_COUNTER, ST_UNIT_BYTES, METRIC, "ckptd_peer_received_bytes_total" },
	[ST_PEER_REPLICAS_HELD] = { "peer_replicas_held", "Replicas held for peers.", ST_GAUGE, ST_UNIT_COUNT, METRIC,
				    "ckptd_peer_replicas_held" },
	[ST_PEER_REPLICA_BYTES] = { "peer_replica_bytes",
				    "Bytes of the replicas held for peers: pool, extra state and tensor tables.",
				    ST_GAUGE, ST_UNIT_BYTES, METRIC, "ckptd_peer_replica_bytes" },
	[ST_PEER_RESTORES] = { "peer_restores", "Copies brought back from peers for restores.", ST_COUNTER,
			       ST_UNIT_COUNT, METRIC, "ckptd_restores_from_peers_total" },
	[ST_PEER_LINK_ERRORS] = { "peer_link_errors",
				  "Peer connections that failed or were refused (certificates, timeouts, garbage).",
				  ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_peer_link_errors_total" },
	[ST_HELD_COPIES_FAILED] = { "held_copies_failed",
				    "Copies in memory (held here, or a peer's) that failed their CRC32C on restore: "
				    "dropped, and the step read from storage.",
				    ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_memory_copies_failed_total" },
	[ST_REQUESTS] = { "requests", "Requests received, by message.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
			  "ckptd_requests_total", .per_message = true },
	[ST_REFUSED_FRAME_BYTES] = { "refused_frame_bytes", "Requests and connections refused or closed by a limit.",
				     ST_COUNTER, ST_UNIT_COUNT, METRIC, "ckptd_refused_total",
				     "limit=\"frame_bytes\"" },
	[ST_REFUSED_FDS] = { "refused_fds_per_frame", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
			     "ckptd_refused_total", "limit=\"fds_per_frame\"" },
	[ST_REFUSED_SESSIONS] = { "refused_sessions", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				  "ckptd_refused_total", "limit=\"sessions\"" },
	[ST_REFUSED_SESSIONS_PER_UID] = { "refused_sessions_per_uid", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					  METRIC, "ckptd_refused_total", "limit=\"sessions_per_uid\"" },
	[ST_REFUSED_BUFFERS] = { "refused_buffers", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				 "ckptd_refused_total", "limit=\"buffers\"" },
	[ST_REFUSED_REGISTERED_BYTES] = { "refused_registered_bytes", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					  METRIC, "ckptd_refused_total", "limit=\"registered_bytes\"" },
	[ST_REFUSED_INFLIGHT_LOADS] = { "refused_inflight_loads", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					METRIC, "ckptd_refused_total", "limit=\"inflight_loads\"" },
	[ST_REFUSED_HELLO_TIMEOUT] = { "refused_hello_timeout", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
				       METRIC, "ckptd_refused_total", "limit=\"hello_timeout\"" },
	[ST_REFUSED_IDLE_TIMEOUT] = { "refused_idle_timeout", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				      "ckptd_refused_total", "limit=\"idle_timeout\"" },
	[ST_REFUSED_FD_EXHAUSTED] = { "refused_fd_exhausted", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				      "ckptd_refused_total", "limit=\"fd_exhausted\"" },
	[ST_REFUSED_PEER_HANDSHAKES] = { "refused_peer_handshakes", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					 METRIC, "ckptd_refused_total", "limit=\"peer_handshakes\"" },
	[ST_REFUSED_PEER_CONNECTIONS] = { "refused_peer_connections", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					  METRIC, "ckptd_refused_total", "limit=\"peer_connections\"" },
	[ST_REFUSED_PEER_PER_ADDRESS] = { "refused_peer_per_address", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					  METRIC, "ckptd_refused_total", "limit=\"peer_per_address\"" },
	[ST_REFUSED_PEER_REPLICAS] = { "refused_peer_replicas", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
				       METRIC, "ckptd_refused_total", "limit=\"peer_replicas\"" },
	[ST_REFUSED_PEER_DEADLINE] = { "refused_peer_deadline", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
				       METRIC, "ckptd_refused_total", "limit=\"peer_deadline\"" },
	[ST_REFUSED_PEER_FRAME_BYTES] = { "refused_peer_frame_bytes", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
					  METRIC, "ckptd_refused_total", "limit=\"peer_frame_bytes\"" },
	[ST_REFUSED_PEER_LIST] = { "refused_peer_list", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT, METRIC,
				   "ckptd_refused_total", "limit=\"peer_list\"" },
	[ST_REFUSED_PEER_MISSING] = { "refused_peer_missing_ranks", "Refused by a limit.", ST_COUNTER, ST_UNIT_COUNT,
				      METRIC, "ckptd_refused_total", "limit=\"peer_missing_ranks\"" },
};

/* The counters of d's statistics, the pool, the stores and the caches. */
static void counters(const struct daemon *d, struct status *st)
{
	const struct stats *s = &d->stats;
	uint64_t *v = st->v;
	v[ST_BYTES_STAGED] = s->bytes_staged;
	v[ST_BYTES_DURABLE] = s->bytes_durable;
	v[ST_BYTES_STORED] = s->bytes_stored;
	v[ST_BYTES_RESTORED_MEMORY] = s->bytes_restored_memory;
	v[ST_BYTES_RESTORED_STORAGE] = s->bytes_restored - s->bytes_restored_memory;
	v[ST_BYTES_RESTORED] = s->bytes_restored;
	v[ST_RESTORES_FROM_MEMORY] = s->restores_from_memory;
	v[ST_RESTORES_FROM_STORAGE] = s->restores_from_storage;
	st->save_stall = s->stall_hist;
	st->save_durable = s->durable_hist;
	v[ST_POOL_BYTES] = d->pool.bytes;
	v[ST_POOL_USED_BYTES] = pool_used_bytes(&d->pool);
	v[ST_INFLIGHT_SAVES] = d->nsaves - d->nwaiting;
	v[ST_WAITING_SAVES] = d->nwaiting;
	v[ST_SAVES_TOTAL] = s->saves_total;
	for (int i = 0; i < LIMIT_N; i++)
		v[ST_REFUSED_FRAME_BYTES + i] = s->refused[i];
	_Static_assert(ST_REFUSED_FD_EXHAUSTED - ST_REFUSED_FRAME_BYTES + 1 == LIMIT_N, "one column per limit");
	for (int i = 0; i < PEER_LIMIT_N; i++)
		v[ST_REFUSED_PEER_HANDSHAKES + i] = atomic_load(&s->peer_refused[i]);
	_Static_assert(ST_REFUSED_PEER_MISSING - ST_REFUSED_PEER_HANDSHAKES + 1 == PEER_LIMIT_N,
		       "one column per peer limit");
	v[ST_SAVES_SUPERSEDED] = s->saves_superseded;
	v[ST_SAVES_SKIPPED] = s->saves_skipped;
	v[ST_SAVES_FAILED_OTHER] = s->saves_failed - s->saves_superseded - s->saves_skipped;
	v[ST_SAVES_FAILED] = s->saves_failed;
	v[ST_STORE_DIRECT_BYTES] = (uint64_t)d->store->direct_bytes;
	/* Every store's: the daemon's and each tenant's own. */
	v[ST_STORE_RETRIES] = (uint64_t)d->store->retries;
	for (size_t i = 0; i < d->cfg.ntenants; i++)
		if (d->tenant_store[i])
			v[ST_STORE_RETRIES] += (uint64_t)d->tenant_store[i]->retries;
	v[ST_STORE_FAILURES] = s->store_failures;
	struct readshare_stats rs = { 0 };
	if (d->readshare)
		readshare_stats(d->readshare, &rs);
	v[ST_STORE_READ_BYTES] = rs.read_bytes;
	v[ST_STORE_READS_SHARED] = rs.shared;
	v[ST_STORE_READ_SHARED_BYTES] = rs.shared_bytes;
	v[ST_RANGE_BYTES_IN] = atomic_load(&s->range_bytes_in);
	v[ST_RANGE_BYTES_OUT] = atomic_load(&s->range_bytes_out);
	v[ST_RANGE_FALLBACKS] = atomic_load(&s->range_fallbacks);
	struct rangecache_stats rcs = { 0 };
	if (d->rangecache)
		rangecache_stats(d->rangecache, &rcs);
	v[ST_RANGE_KEPT_BYTES] = rcs.bytes;
	v[ST_MANIFEST_READS] = catalog_manifest_gets();
	v[ST_STEP_INDEX_READS] = catalog_index_gets();
	v[ST_STEP_INDEX_WRITES] = catalog_index_puts();
	v[ST_WAIT_POLLS] = s->wait_polls;
	struct mancache_stats mc = { 0 };
	if (d->mancache)
		mancache_stats(d->mancache, &mc);
	v[ST_MANIFEST_CACHE_HITS] = mc.hits;
	v[ST_MANIFEST_CACHE_MISSES] = mc.misses;
	v[ST_MANIFEST_CACHE_BYTES] = mc.bytes;
	v[ST_MANIFEST_CACHE_ENTRIES] = mc.entries;
	v[ST_SESSIONS] = d->nsessions;
	v[ST_RECOVERED_FILES] = s->recovered_files;
	v[ST_UPTIME_NS] = clock_now_ns() - d->start_ns;
	v[ST_CHUNK_BYTES] = d->pool.chunk_bytes;
	v[ST_RECLAIMED_BYTES] = s->reclaimed_bytes;
	v[ST_HELD_COPIES] = d->nheld;
	v[ST_PEER_BYTES_SENT] = atomic_load(&d->stats.peer_bytes_sent);
	v[ST_PEER_BYTES_RECEIVED] = atomic_load(&d->stats.peer_bytes_received);
	v[ST_PEER_RESTORES] = atomic_load(&d->stats.peer_restores);
	v[ST_PEER_LINK_ERRORS] = atomic_load(&d->stats.peer_link_errors);
	v[ST_HELD_COPIES_FAILED] = atomic_load(&d->stats.held_copies_failed);
	memcpy(st->requests, s->requests, sizeof(st->requests));
	memcpy(st->request_name, s->request_name, sizeof(st->request_name));
}

/* This process's CPU time and peak memory. */
static void process_usage(uint64_t *v)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		v[ST_CPU_NS] = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
			       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
		v[ST_PEAK_RSS_BYTES] = (uint64_t)ru.ru_maxrss * 1024;
	}
}

/* What status says in words: the storage and CUDA. */
static void describe(const struct daemon *d, struct status *st)
{
	st->backend = d->store_backend;
	snprintf(st->storage, sizeof(st->storage), "%s%s%s%s", d->store->url,
		 d->store->cred_source[0] ? " (credentials: " : "", d->store->cred_source,
		 d->store->cred_source[0] ? ")" : "");
	if (d->cuda)
		cuda_describe(d->cuda, st->cuda, sizeof(st->cuda));
	else
		snprintf(st->cuda, sizeof(st->cuda), "off: %s", d->cuda_why);
}

/* The recovered files and the last failures, newest first. */
static void recent(const struct daemon *d, struct status *st)
{
	const struct stats *s = &d->stats;
	st->nrecovered = s->nrecovered;
	for (uint32_t i = 0; i < s->nrecovered && i < RECOVERED_LIST; i++)
		st->recovered[i] = (char *)s->recovered[i];
	for (uint64_t k = 0; k < FAILURE_LIST && k < s->nfailures; k++) {
		const struct save_failure *f = &s->failures[(s->nfailures - 1 - k) % FAILURE_LIST];
		st->failures[st->nfailures++] = (struct status_failure){ .job = f->job,
									 .msg = f->msg,
									 .step = f->step,
									 .rank = f->rank,
									 .status = f->status,
									 .unix_ns = f->unix_ns };
	}
}

/* A row per tenant: sessions, saves in flight and their pool bytes. */
static void tenant_rows(const struct daemon *d, struct status *st)
{
	st->ntenants = (uint32_t)d->cfg.ntenants;
	for (uint32_t i = 0; i < st->ntenants; i++)
		st->tenants[i] = (struct status_tenant){ .name = d->cfg.tenants[i].name,
							 .sessions = d->tenant_sessions[i] };
	const struct save *ts;
	TAILQ_FOREACH (ts, &d->saves, link) {
		const struct tenant_config *t = config_tenant_of_job(&d->cfg, ts->job);
		if (t == NULL)
			continue;
		struct status_tenant *x = &st->tenants[t - d->cfg.tenants];
		x->inflight_saves++;
		if (ts->have_chunks)
			x->pool_bytes += ts->pool_bytes;
	}
}

/* The memory tier: its bytes (counted for every copy) and the list of copies. */
static void held_rows(const struct daemon *d, struct status *st)
{
	uint64_t *v = st->v;
	/* Every number is filled even when the list cannot be. */
	st->held = calloc(d->nheld ? d->nheld : 1, sizeof(*st->held));
	const struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink) {
		v[ST_POOL_HELD_BYTES] += sv->pool_bytes;
		if (!sv->durable && !sv->replica)
			v[ST_POOL_MEMORY_ONLY_BYTES] += sv->pool_bytes;
		if (sv->replica) {
			v[ST_PEER_REPLICAS_HELD]++;
			v[ST_PEER_REPLICA_BYTES] += sv->pool_bytes + sv->meta_bytes;
		}
		if (st->held == NULL || st->nheld == d->nheld)
			continue;
		st->held[st->nheld++] = (struct status_held){ .job = sv->job,
							      .attempt = sv->attempt,
							      .rank = sv->rank,
							      .world_size = sv->world_size,
							      .step = sv->step,
							      .bytes = sv->shard_bytes,
							      .tier = (int)sv->tier,
							      .durable = sv->durable };
	}
}

int status_snapshot(const struct daemon *d, struct status *st)
{
	memset(st, 0, sizeof(*st));
	counters(d, st);
	process_usage(st->v);
	describe(d, st);
	recent(d, st);
	tenant_rows(d, st);
	held_rows(d, st);
	return st->held ? 0 : -ENOMEM;
}

void status_release(struct status *st)
{
	free(st->held);
	st->held = NULL;
	st->nheld = 0;
}

/* Every column shown in StatusReply, into its field (found by name). */
static void reply_columns(const struct status *st, Ckpt__StatusReply *rep)
{
	for (size_t i = 0; i < ST_NCOLS; i++) {
		const struct status_col *c = &status_cols[i];
		if (!(c->views & SV_REPLY))
			continue;
		const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field_by_name(
			&ckpt__status_reply__descriptor, c->name);
		assert(fd != NULL && fd->label != PROTOBUF_C_LABEL_REPEATED);
		void *p = (char *)rep + fd->offset;
		if (fd->type == PROTOBUF_C_TYPE_UINT32)
			*(uint32_t *)p = (uint32_t)st->v[i];
		else if (fd->type == PROTOBUF_C_TYPE_UINT64)
			*(uint64_t *)p = st->v[i];
		else
			assert(!"a status column's StatusReply field is uint32 or uint64");
	}
}

/* The tenant rows, in one block: the pointers, then the rows. */
static int reply_tenants(const struct status *st, Ckpt__StatusReply *rep)
{
	if (st->ntenants == 0)
		return 0;
	void *tb = calloc(st->ntenants, sizeof(Ckpt__TenantStatus *) + sizeof(Ckpt__TenantStatus));
	if (tb == NULL)
		return -ENOMEM;
	Ckpt__TenantStatus **tp = tb;
	Ckpt__TenantStatus *t = (Ckpt__TenantStatus *)(tp + st->ntenants);
	for (uint32_t k = 0; k < st->ntenants; k++) {
		ckpt__tenant_status__init(&t[k]);
		t[k].name = (char *)st->tenants[k].name;
		t[k].sessions = st->tenants[k].sessions;
		t[k].inflight_saves = st->tenants[k].inflight_saves;
		t[k].pool_bytes = st->tenants[k].pool_bytes;
		tp[k] = &t[k];
	}
	rep->n_tenants = st->ntenants;
	rep->tenants = tp;
	return 0;
}

/* The recent failures, in one block as the tenants. */
static int reply_failures(const struct status *st, Ckpt__StatusReply *rep)
{
	if (st->nfailures == 0)
		return 0;
	void *fb = calloc(st->nfailures, sizeof(Ckpt__SaveFailure *) + sizeof(Ckpt__SaveFailure));
	if (fb == NULL)
		return -ENOMEM;
	Ckpt__SaveFailure **fp = fb;
	Ckpt__SaveFailure *sf = (Ckpt__SaveFailure *)(fp + st->nfailures);
	for (uint32_t k = 0; k < st->nfailures; k++) {
		const struct status_failure *x = &st->failures[k];
		ckpt__save_failure__init(&sf[k]);
		sf[k].job = (char *)x->job;
		sf[k].step = x->step;
		sf[k].rank = x->rank;
		sf[k].status = wire_status(x->status);
		sf[k].message = (char *)x->msg;
		sf[k].unix_ns = x->unix_ns;
		fp[k] = &sf[k];
	}
	rep->n_failures = st->nfailures;
	rep->failures = fp;
	return 0;
}

/* The copies held, in one block as the tenants (allocated even when none
 * is held). */
static int reply_held(const struct status *st, Ckpt__StatusReply *rep)
{
	size_t n = st->nheld;
	void *blk = calloc(n ? n : 1, sizeof(Ckpt__HeldCopy *) + sizeof(Ckpt__HeldCopy));
	if (blk == NULL)
		return -ENOMEM;
	Ckpt__HeldCopy **heldp = blk;
	Ckpt__HeldCopy *held = (Ckpt__HeldCopy *)(heldp + (n ? n : 1));
	for (size_t k = 0; k < n; k++) {
		const struct status_held *h = &st->held[k];
		ckpt__held_copy__init(&held[k]);
		held[k].job = (char *)h->job;
		held[k].rank = h->rank;
		held[k].world_size = h->world_size;
		held[k].step = h->step;
		held[k].bytes = h->bytes;
		held[k].attempt_id = (char *)h->attempt;
		held[k].tier = (Ckpt__Tier)h->tier;
		held[k].durable = h->durable;
		heldp[k] = &held[k];
	}
	rep->n_held = n;
	rep->held = heldp;
	return 0;
}

int status_reply_fill(const struct status *st, Ckpt__StatusReply *rep)
{
	reply_columns(st, rep);
	rep->n_recovered = st->nrecovered;
	rep->recovered = (char **)st->recovered;
	rep->storage = (char *)st->storage;
	rep->cuda = (char *)st->cuda;
	if (reply_tenants(st, rep) < 0)
		return -ENOMEM;
	if (reply_failures(st, rep) < 0 || reply_held(st, rep) < 0) {
		status_reply_free(rep);
		return -ENOMEM;
	}
	return 0;
}

void status_reply_free(Ckpt__StatusReply *rep)
{
	free(rep->held);
	rep->held = NULL;
	rep->n_held = 0;
	free(rep->tenants);
	rep->tenants = NULL;
	rep->n_tenants = 0;
	free(rep->failures);
	rep->failures = NULL;
	rep->n_failures = 0;
}

void status_line_render(const struct status *st, char *buf, size_t len)
{
	const uint64_t *v = st->v;
	snprintf(buf, len,
		 "STATUS=%" PRIu64 " sessions, pool %" PRIu64 "/%" PRIu64 " MiB used (%" PRIu64 " held), %" PRIu64
		 " saves in flight, %" PRIu64 " waiting",
		 v[ST_SESSIONS], v[ST_POOL_USED_BYTES] >> 20, v[ST_POOL_BYTES] >> 20, v[ST_HELD_COPIES],
		 v[ST_INFLIGHT_SAVES], v[ST_WAITING_SAVES]);
}
